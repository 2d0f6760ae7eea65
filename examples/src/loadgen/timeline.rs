//! Per-second series of a load run, for the charts of `herald-loadgen --report`: how many
//! messages were sent and delivered in each second, and the send → deliver latency
//! percentiles of the messages sent in each second.
//!
//! Seconds count from the start of sending, so second 0 is the first second of the
//! warm-up. A send counts in the second of its body timestamp (in rate mode its scheduled
//! time), a delivery in the second it arrived, and its latency in the second the message
//! was sent — as the run's overall figures count it (their window is by send time too), so
//! a slow second shows when the messages that waited were sent.
//!
//! Recording is sharded like [`LatencyRecorder`](super::stats::LatencyRecorder), on fewer
//! shards since each holds a histogram per second. Those histograms keep two significant
//! digits (1 % precision, plenty for a chart; the overall figures keep three) and grow only
//! as far as the largest latency seen, so a second costs a few KiB per shard. Only runs that
//! ask for it ([`LoadConfig::timeline`](super::LoadConfig::timeline)) record anything here.

use std::sync::Mutex;

use hdrhistogram::Histogram;

use super::stats::{LatencySummary, MAX_TRACKED_US};

/// Shards of a recorder: enough that two cores rarely meet on one lock.
const SHARDS: usize = 8;
/// Precision of the per-second histograms.
const SIGNIFICANT_DIGITS: u8 = 2;
const MICROS_PER_SECOND: u64 = 1_000_000;

/// Records a run's per-second series while it runs; [`TimelineRecorder::timeline`] adds
/// them up at the end.
#[derive(Debug)]
pub struct TimelineRecorder {
    /// Shard `i` serves the users whose index is `i` modulo the shard count.
    shards: Vec<Mutex<Shard>>,
    /// Seconds it holds; a sample later than that is dropped. A run is bounded in time
    /// (warm-up, window, drain timeout), so only a bogus timestamp could be.
    max_seconds: usize,
}

/// One shard's seconds, each vector indexed by the second since the start.
#[derive(Debug, Default)]
struct Shard {
    /// Messages sent.
    sent: Vec<u64>,
    /// Messages delivered.
    delivered: Vec<u64>,
    /// Send → deliver latency by send second, in microseconds: `[0]` of pairs on one
    /// endpoint, `[1]` of pairs across endpoints (together, all of them). `None` until
    /// the second's first sample.
    latency: [Vec<Option<Histogram<u32>>>; 2],
}

impl TimelineRecorder {
    /// A recorder that holds `max_seconds` seconds from the start of sending.
    pub fn new(max_seconds: usize) -> Self {
        Self { shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(), max_seconds }
    }

    /// User `user` sent a message `sent_us` microseconds after the start.
    pub fn record_sent(&self, user: usize, sent_us: u64) {
        let Some(second) = self.second(sent_us) else { return };
        let mut shard = self.shard(user);
        *slot(&mut shard.sent, second) += 1;
    }

    /// User `user` received a message sent `sent_us` microseconds after the start, at
    /// `delivered_us`; `crosses` says whether the pair's users are on different endpoints.
    pub fn record_delivery(&self, user: usize, sent_us: u64, delivered_us: u64, crosses: bool) {
        let latency = delivered_us.saturating_sub(sent_us).clamp(1, MAX_TRACKED_US);
        let delivered_second = self.second(delivered_us);
        let sent_second = self.second(sent_us);
        let mut shard = self.shard(user);
        if let Some(second) = delivered_second {
            *slot(&mut shard.delivered, second) += 1;
        }
        if let Some(second) = sent_second {
            let histogram = slot(&mut shard.latency[usize::from(crosses)], second).get_or_insert_with(new_histogram);
            // Recording grows the histogram; were that impossible, the clamped value still counts.
            if histogram.record(latency).is_err() {
                histogram.saturating_record(latency);
            }
        }
    }

    /// Every shard added up: one [`Second`] from the start to the last second that saw
    /// anything.
    pub fn timeline(&self) -> Timeline {
        let mut total = Shard::default();
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|poison| poison.into_inner());
            add_counts(&mut total.sent, &shard.sent);
            add_counts(&mut total.delivered, &shard.delivered);
            for (into, from) in total.latency.iter_mut().zip(&shard.latency) {
                add_histograms(into, from);
            }
        }
        let seconds = [total.sent.len(), total.delivered.len(), total.latency[0].len(), total.latency[1].len()]
            .into_iter()
            .max()
            .unwrap_or(0);
        let summary = |histograms: &[Option<Histogram<u32>>], second: usize| {
            histograms.get(second).and_then(Option::as_ref).map(LatencySummary::of).unwrap_or_default()
        };
        let seconds = (0..seconds)
            .map(|second| {
                let same = total.latency[0].get(second).and_then(Option::as_ref);
                let cross = total.latency[1].get(second).and_then(Option::as_ref);
                let mut both = new_histogram();
                for histogram in [same, cross].into_iter().flatten() {
                    // Both grow as needed: adding cannot fail.
                    let _ = both.add(histogram);
                }
                Second {
                    sent: total.sent.get(second).copied().unwrap_or(0),
                    delivered: total.delivered.get(second).copied().unwrap_or(0),
                    latency: LatencySummary::of(&both),
                    same_endpoint_latency: summary(&total.latency[0], second),
                    cross_endpoint_latency: summary(&total.latency[1], second),
                }
            })
            .collect();
        Timeline { seconds }
    }

    fn second(&self, micros: u64) -> Option<usize> {
        usize::try_from(micros / MICROS_PER_SECOND).ok().filter(|second| *second < self.max_seconds)
    }

    fn shard(&self, user: usize) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[user % self.shards.len()].lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

/// The element `index` of `values`, growing it with defaults as needed.
fn slot<T: Default>(values: &mut Vec<T>, index: usize) -> &mut T {
    if values.len() <= index {
        values.resize_with(index + 1, T::default);
    }
    &mut values[index]
}

fn add_counts(into: &mut Vec<u64>, from: &[u64]) {
    for (second, count) in from.iter().enumerate() {
        *slot(into, second) += count;
    }
}

fn add_histograms(into: &mut Vec<Option<Histogram<u32>>>, from: &[Option<Histogram<u32>>]) {
    for (second, histogram) in from.iter().enumerate() {
        if let Some(histogram) = histogram {
            // Both grow as needed: adding cannot fail.
            let _ = slot(into, second).get_or_insert_with(new_histogram).add(histogram);
        }
    }
}

#[allow(clippy::expect_used, reason = "a constant precision that hdrhistogram accepts")]
fn new_histogram() -> Histogram<u32> {
    Histogram::new(SIGNIFICANT_DIGITS).expect("valid histogram precision")
}

/// A run second by second, from the start of sending (see the module doc for which second
/// an event counts in).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// Second `i` covers `[i, i + 1)` seconds after the start of sending.
    pub seconds: Vec<Second>,
}

/// What happened in one second of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Second {
    /// Messages sent in it.
    pub sent: u64,
    /// Messages delivered in it.
    pub delivered: u64,
    /// Send → deliver latency of the messages sent in it (all zero if none arrived).
    pub latency: LatencySummary,
    /// The same, of pairs whose users are on one endpoint.
    pub same_endpoint_latency: LatencySummary,
    /// The same, of pairs whose users are on different endpoints.
    pub cross_endpoint_latency: LatencySummary,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;
    const S: u64 = 1_000_000;

    /// Whether `value` is within hdrhistogram's 1 % of `expected`.
    fn near(value: u64, expected: u64) -> bool {
        value.abs_diff(expected) * 100 <= expected
    }

    #[test]
    fn samples_fall_into_the_second_they_belong_to() {
        let recorder = TimelineRecorder::new(10);
        // Second 0: 100 sends; 99 arrive after 1 ms, one after 50 ms, two of them in second 1.
        for user in 0..100 {
            let sent = user as u64 * 9 * MS;
            recorder.record_sent(user, sent);
            let latency = if user == 42 { 50 * MS } else { MS };
            recorder.record_delivery(user ^ 1, sent, sent + latency, false);
        }
        // Second 2: 1,000 sends that arrive after 10..=19 ms; second 1 stays empty of sends.
        for index in 0..1000u64 {
            let sent = 2 * S + index * MS / 2;
            recorder.record_sent(index as usize, sent);
            recorder.record_delivery(index as usize, sent, sent + (10 + index % 10) * MS, index % 2 == 0);
        }
        let timeline = recorder.timeline();
        let seconds = &timeline.seconds;
        assert_eq!(seconds.len(), 3);
        assert_eq!(seconds.iter().map(|s| s.sent).collect::<Vec<_>>(), [100, 0, 1000]);
        // The last send of second 0 (0.891 s) arrives at 0.892 s, the outlier at 0.428 s.
        assert_eq!(seconds.iter().map(|s| s.delivered).collect::<Vec<_>>(), [100, 0, 1000]);

        let first = seconds[0].latency;
        assert_eq!(first.count, 100);
        assert!(near(first.p50_us, MS), "{first:?}");
        assert!(near(first.p999_us, 50 * MS) && near(first.max_us, 50 * MS), "the outlier: {first:?}");
        assert_eq!((seconds[0].same_endpoint_latency.count, seconds[0].cross_endpoint_latency.count), (100, 0));

        assert_eq!(seconds[1].latency, LatencySummary::default(), "nothing sent in second 1");

        let third = seconds[2];
        assert_eq!(third.latency.count, 1000);
        assert!(near(third.latency.p50_us, 14 * MS), "{:?}", third.latency);
        assert!(near(third.latency.p99_us, 19 * MS) && near(third.latency.max_us, 19 * MS), "{:?}", third.latency);
        assert_eq!((third.same_endpoint_latency.count, third.cross_endpoint_latency.count), (500, 500));
        // Even indexes (cross) took 10, 12, … 18 ms; odd ones 11 … 19 ms.
        assert!(near(third.cross_endpoint_latency.max_us, 18 * MS), "{:?}", third.cross_endpoint_latency);
        assert!(near(third.same_endpoint_latency.max_us, 19 * MS), "{:?}", third.same_endpoint_latency);
    }

    #[test]
    fn late_deliveries_count_where_they_arrive_and_latency_where_it_was_sent() {
        let recorder = TimelineRecorder::new(10);
        recorder.record_sent(0, 500 * MS);
        recorder.record_delivery(1, 500 * MS, 3 * S + 500 * MS, true);
        let seconds = recorder.timeline().seconds;
        assert_eq!(seconds.len(), 4);
        assert_eq!((seconds[0].sent, seconds[0].delivered, seconds[3].delivered), (1, 0, 1));
        assert!(near(seconds[0].latency.max_us, 3 * S), "{:?}", seconds[0].latency);
        assert_eq!(seconds[0].cross_endpoint_latency.count, 1);
        assert_eq!(seconds[3].latency.count, 0);
    }

    #[test]
    fn samples_past_the_last_second_are_dropped() {
        let recorder = TimelineRecorder::new(2);
        recorder.record_sent(0, 5 * S);
        recorder.record_delivery(0, 0, 5 * S, false);
        let seconds = recorder.timeline().seconds;
        assert_eq!(seconds.len(), 1, "{seconds:?}");
        assert_eq!((seconds[0].sent, seconds[0].delivered, seconds[0].latency.count), (0, 0, 1));
    }

    #[test]
    fn an_empty_run_has_no_seconds() {
        assert_eq!(TimelineRecorder::new(10).timeline(), Timeline::default());
    }
}

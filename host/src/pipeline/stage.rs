//! Timing the steps of a send.

use std::sync::OnceLock;

/// How long one step of a send took: `herald_send_stage_seconds{stage}`, so the tail of
/// send → ack and send → deliver can be pinned on a step (`mark`: the dedup mark; `queue`:
/// policy, seq and id; `commit`: waiting for the group commit; `complete`: completing the
/// dedup mark, after the ack; `release`: the fan-out of a send, including waits for earlier ones of its
/// conversation; `fan_out`: one message's fan-out).
pub(super) struct Stage {
    name: StageName,
    started: std::time::Instant,
}

/// The steps [`Stage`] times, each with its `stage` label.
#[derive(Clone, Copy)]
pub(super) enum StageName {
    Mark,
    Queue,
    Commit,
    Complete,
    Release,
    FanOut,
}

impl StageName {
    const ALL: [Self; 6] = [Self::Mark, Self::Queue, Self::Commit, Self::Complete, Self::Release, Self::FanOut];

    fn label(self) -> &'static str {
        match self {
            Self::Mark => "mark",
            Self::Queue => "queue",
            Self::Commit => "commit",
            Self::Complete => "complete",
            Self::Release => "release",
            Self::FanOut => "fan_out",
        }
    }

    /// Its histogram, registered once: `histogram!` with a label built the key anew and
    /// looked it up on every call, two allocations each, twelve per message.
    fn histogram(self) -> &'static metrics::Histogram {
        static HISTOGRAMS: OnceLock<Vec<metrics::Histogram>> = OnceLock::new();
        let all = HISTOGRAMS.get_or_init(|| {
            StageName::ALL
                .iter()
                .map(|stage| metrics::histogram!("herald_send_stage_seconds", "stage" => stage.label()))
                .collect()
        });
        &all[self as usize]
    }
}

impl Stage {
    pub(super) fn start(name: StageName) -> Self {
        Self { name, started: std::time::Instant::now() }
    }

    pub(super) fn done(self) {
        self.name.histogram().record(self.started.elapsed().as_secs_f64());
    }
}

//! The sizes of the node's in-memory maps as `herald_map_entries{map=…}` gauges, and the
//! runtime's live tasks as `herald_runtime_alive_tasks`: what grows without bound shows
//! here first (the soak test, `scripts/soak.sh`, fails on a growing trend of any of them).

use std::sync::Arc;
use std::time::Duration;

use crate::delivery::Delivery;
use crate::gateway::Gateway;
use crate::ids::SeqAllocator;
use crate::membership::Membership;
use crate::pipeline::Pipeline;
use crate::pipeline::dedup::DedupMarks;
use crate::pipeline::lanes::Lanes;
use crate::routing::RouteTable;
use crate::routing::rooms::Rooms;

/// Reports between two looks at the maps' spare room.
const SHRINK_EVERY: u64 = 10;

/// Every map whose size is reported.
pub(crate) struct Maps {
    pub gateway: Arc<Gateway>,
    pub delivery: Arc<Delivery>,
    pub routes: Arc<dyn RouteTable>,
    pub rooms: Arc<Rooms>,
    pub dedup: Arc<dyn DedupMarks>,
    pub membership: Arc<Membership>,
    pub pipeline: Arc<Pipeline>,
    pub seqs: Arc<SeqAllocator>,
    pub lanes: Arc<Lanes>,
}

impl Maps {
    /// Each map's name (the gauge's `map` label) and entries now. Runs the caches' pending
    /// upkeep (expiry) first, so an idle node frees what expired.
    pub fn sizes(&self) -> [(&'static str, u64); 14] {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let sessions = self.delivery.sessions();
        let (rooms, subscribed_connections) = self.rooms.sizes();
        let (connections, intake_buckets) = self.gateway.map_sizes();
        [
            ("connections", count(connections)),
            ("sessions", count(sessions.len())),
            ("parked_sessions", count(sessions.parked_len())),
            ("routes", count(self.routes.held_here())),
            ("rooms", count(rooms)),
            ("room_subscriptions", count(subscribed_connections)),
            ("lanes", count(self.lanes.len())),
            ("seq_conversations", count(self.seqs.conversations())),
            ("dedup_marks", self.dedup.held_here()),
            ("group_lists", self.membership.cached_lists()),
            ("known_direct", self.pipeline.known_direct()),
            ("intake_buckets", count(intake_buckets)),
            ("retry_timers", count(self.delivery.pending_retries())),
            ("hop_retries", count(self.delivery.waiting_hops())),
        ]
    }

    /// Gives back the room the per-connection maps grew to for a crowd that has left.
    fn shrink_if_sparse(&self) {
        self.gateway.shrink_if_sparse();
        self.delivery.sessions().shrink_if_sparse();
        self.routes.shrink_if_sparse();
    }

    /// Sets the gauges every `every`, for as long as it runs, and every [`SHRINK_EVERY`]
    /// reports gives back the maps' spare room.
    pub async fn report_every(self, every: Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for report in 1u64.. {
            ticks.tick().await;
            if report.is_multiple_of(SHRINK_EVERY) {
                self.shrink_if_sparse();
            }
            for (map, entries) in self.sizes() {
                metrics::gauge!("herald_map_entries", "map" => map).set(entries as f64);
            }
            let tasks = tokio::runtime::Handle::current().metrics().num_alive_tasks();
            metrics::gauge!("herald_runtime_alive_tasks").set(tasks as f64);
        }
    }
}

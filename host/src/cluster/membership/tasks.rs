//! The two background tasks of a membership: the heartbeat, which renews the lease and
//! fences the node when it may have lapsed, and the view, which installs each new ring.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::{Instant, MissedTickBehavior};

use super::registry::{self, Listing, Renewed};
use super::{COMPLAIN_EVERY, Shared, Snapshot};
use crate::config::Placement;
use crate::routing::placement::Homes;
use crate::routing::ring::Ring;
use crate::routing::topology::RingView;
use crate::telemetry::Throttle;

/// What installing a listing did.
pub(super) enum Installed {
    /// A newer ring is in force.
    Newer,
    /// The ring in force has this epoch already.
    Same,
    /// The listing is older than the ring in force: Redis lost its data and the nodes
    /// have not re-asserted their leases yet.
    Older,
}

impl Shared {
    /// Renews the lease (taken in data set `generation`) every heartbeat; fences the node
    /// when the lease may have lapsed. Ends when the lease is lost.
    pub(super) async fn keep_lease(self: Arc<Self>, mut generation: String) {
        let every = self.settings.heartbeat;
        let mut beats = tokio::time::interval_at(Instant::now() + every, every);
        beats.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let trouble = Throttle::every(COMPLAIN_EVERY);
        loop {
            self.fencing(beats.tick()).await;
            if self.paused.load(Ordering::SeqCst) {
                continue;
            }
            let sent = Instant::now();
            let known = self.current.load().view.epoch;
            let ttl = self.settings.lease_ttl;
            let renew = self.registry.renew(self.node, &self.holder, &generation, ttl, known, every);
            match self.fencing(renew).await {
                Ok(renewed @ (Renewed::Extended | Renewed::Reasserted { .. })) => {
                    if let Renewed::Reasserted { generation: new } = renewed {
                        tracing::warn!(node = %self.node, "Redis had lost its data; this node's lease is taken again");
                        generation = new;
                        self.data_lost.send_modify(|count| *count += 1);
                    }
                    if trouble.cleared() {
                        tracing::info!(node = %self.node, "lease renewed again");
                    }
                    self.lease.renewed(sent);
                    self.publish_fence();
                }
                Ok(Renewed::Lost { holder }) => {
                    self.lease.give_up();
                    self.publish_fence();
                    let holder = registry::address(&holder).map(|address| address.to_string());
                    tracing::error!(
                        node = %self.node, held_by = holder.as_deref().unwrap_or("no one"),
                        "lease lost: it lapsed in Redis, and another node may hold the id now; this node must join again"
                    );
                    self.lost.send_replace(true);
                    return;
                }
                Err(failure) => {
                    if let Some(held_back) = trouble.allow() {
                        tracing::warn!(node = %self.node, %failure, held_back, "cannot renew this node's lease");
                    }
                }
            }
        }
    }

    /// Awaits `work`, turning `fenced` true meanwhile if the lease's validity runs out.
    async fn fencing<T>(&self, work: impl Future<Output = T>) -> T {
        tokio::pin!(work);
        loop {
            let until = if *self.fenced.borrow() { None } else { self.lease.valid_until() };
            let Some(until) = until else { return work.await };
            tokio::select! {
                value = &mut work => return value,
                () = tokio::time::sleep_until(until) => self.publish_fence(),
            }
        }
    }

    /// Makes `fenced` say what the lease clock says now.
    pub(super) fn publish_fence(&self) {
        let fenced = !self.lease.holds();
        let changed = self.fenced.send_if_modified(|current| std::mem::replace(current, fenced) != fenced);
        match (changed, fenced) {
            (true, true) => tracing::error!(node = %self.node, "lease may have lapsed; this node is fenced"),
            (true, false) => tracing::info!(node = %self.node, "lease held again; this node is no longer fenced"),
            (false, _) => {}
        }
    }

    /// Reads the members every `poll` and installs each new ring. Runs until aborted.
    pub(super) async fn follow_members(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(self.settings.poll);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let (trouble, regress) = (Throttle::every(COMPLAIN_EVERY), Throttle::every(COMPLAIN_EVERY));
        loop {
            ticks.tick().await;
            match self.registry.view(self.settings.heartbeat).await {
                Ok(listing) => {
                    if trouble.cleared() {
                        tracing::info!(node = %self.node, "cluster view refreshed again");
                    }
                    if let Installed::Older = self.install(&listing)
                        && let Some(held_back) = regress.allow()
                    {
                        let (seen, found) = (self.current.load().view.epoch, listing.epoch);
                        tracing::warn!(
                            seen,
                            found,
                            held_back,
                            "Redis's cluster epoch went back (data lost?); keeping the last view until the leases \
                             are re-asserted"
                        );
                    }
                }
                Err(failure) => {
                    if let Some(held_back) = trouble.allow() {
                        tracing::warn!(node = %self.node, %failure, held_back, "cannot refresh the cluster view; keeping the last one");
                    }
                }
            }
        }
    }

    /// Puts `listing` in force if it is newer than the ring in force.
    pub(super) fn install(&self, listing: &Listing) -> Installed {
        let in_force = self.current.load().view.epoch;
        if listing.epoch <= in_force {
            return if listing.epoch == in_force { Installed::Same } else { Installed::Older };
        }
        let previous =
            self.current.swap(Arc::new(snapshot(listing, self.settings.virtual_nodes, self.settings.placement)));
        let now = Instant::now();
        let mut last_seen = self.last_seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for member in &previous.members {
            if let Some(address) = member.address {
                last_seen.insert(member.node, (address, now));
            }
        }
        drop(last_seen);
        self.epoch.send_replace(listing.epoch);
        tracing::info!(
            node = %self.node, epoch = listing.epoch,
            members = ?listing.members.iter().map(|member| member.node.0).collect::<Vec<_>>(),
            "cluster ring replaced"
        );
        Installed::Newer
    }
}

/// The ring of `listing`'s members, and the homes `placement` gives their client addresses.
pub(super) fn snapshot(listing: &Listing, virtual_nodes: u32, placement: Placement) -> Snapshot {
    let nodes: Vec<u32> = listing.members.iter().map(|member| member.node.0).collect();
    let upstream = listing.members.iter().filter_map(|member| Some((member.node, member.client.clone()?))).collect();
    let homes = Homes::new(placement, upstream);
    let view = RingView { epoch: listing.epoch, ring: Ring::new(&nodes, virtual_nodes), homes };
    Snapshot { view: Arc::new(view), members: listing.members.clone() }
}

//! Cluster membership as the rest of the node sees it: the ring in force, with an epoch.
//!
//! The ring is read on every send and replaced whole when membership changes, so it is
//! held in an [`ArcSwap`]: a reader gets a consistent ring without a lock, and a writer
//! swaps in the next one while sends go on. The epoch grows with each replacement, so a
//! node can tell a newer view from an older one. Embedded mode is one node on the ring for
//! ever; cluster mode replaces the view as nodes join and leave.
//!
//! A view also carries the users' home nodes ([`Homes`]): nginx's upstream rebuilt from
//! the same members, so the ring and the homes of one epoch always go together.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::placement::Homes;
use super::ring::{DEFAULT_VIRTUAL_NODES, Ring};
use crate::model::NodeId;

/// One version of the ring.
#[derive(Debug)]
pub struct RingView {
    /// Grows with each membership change.
    pub epoch: u64,
    pub ring: Ring,
    /// Where nginx sends each user's connections under these members (no homes without
    /// `cluster.placement`).
    pub homes: Homes,
}

impl RingView {
    /// The node owning `key`; `None` only for an empty ring.
    pub fn owner(&self, key: &str) -> Option<NodeId> {
        self.ring.owner(key).map(NodeId)
    }

    /// The node `user`'s connections are meant to reach; `None` without placement.
    pub fn home(&self, user: &str) -> Option<NodeId> {
        self.homes.home(user)
    }
}

/// Who is in the cluster now.
pub trait Topology: Send + Sync + 'static {
    /// The ring in force (cheap: one atomic load and a reference count).
    fn view(&self) -> Arc<RingView>;

    /// Whether this node's own membership is certainly still valid at this instant, so it
    /// may act as the owner the ring makes it (take seqs, commit). Cluster mode: false from
    /// before any other node could see this node's lease lapse. Always true in embedded
    /// mode, which nobody else can take over. Cheap: called twice per send.
    fn holds_lease(&self) -> bool {
        true
    }
}

/// A ring that changes only when told to: embedded mode's one node, or a fixed set.
pub struct StaticTopology {
    current: ArcSwap<RingView>,
}

impl StaticTopology {
    /// A ring of `nodes` at epoch 1.
    pub fn new(nodes: &[NodeId]) -> Self {
        Self { current: ArcSwap::from_pointee(view(1, nodes)) }
    }

    /// Replaces the ring with one of `nodes`; returns the new epoch.
    pub fn replace(&self, nodes: &[NodeId]) -> u64 {
        let epoch = self.current.load().epoch + 1;
        self.current.store(Arc::new(view(epoch, nodes)));
        epoch
    }
}

fn view(epoch: u64, nodes: &[NodeId]) -> RingView {
    let ids: Vec<u32> = nodes.iter().map(|node| node.0).collect();
    RingView { epoch, ring: Ring::new(&ids, DEFAULT_VIRTUAL_NODES), homes: Homes::none() }
}

impl Topology for StaticTopology {
    fn view(&self) -> Arc<RingView> {
        self.current.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_ring_has_a_newer_epoch_and_readers_keep_the_one_they_hold() {
        let topology = StaticTopology::new(&[NodeId(1)]);
        let before = topology.view();
        assert_eq!((before.epoch, before.owner("dm:a:b")), (1, Some(NodeId(1))));
        assert_eq!(topology.replace(&[NodeId(2)]), 2);
        assert_eq!(topology.view().owner("dm:a:b"), Some(NodeId(2)));
        assert_eq!(before.owner("dm:a:b"), Some(NodeId(1)), "a view once read does not change under its reader");
    }
}

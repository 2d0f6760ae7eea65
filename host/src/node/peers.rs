//! What this node does for the other nodes of a cluster: the called side of the node bus.
//!
//! [`PeerServer`](crate::cluster::peer::PeerServer) accepts links from the other nodes and
//! hands each request here; every request lands on the same services a local client's
//! would: a forwarded send is admitted by this node's pipeline (it owns the conversation),
//! a delivery and a room message are pushed by this node's delivery to the devices
//! connected here, a kick closes a connection of this node's gateway.

use std::sync::Arc;

use async_trait::async_trait;

use crate::cluster::peer::PeerHandler;
use crate::delivery::Delivery;
use crate::gateway::Gateway;
use crate::membership::Membership;
use crate::model::{ConversationId, DeviceLedger, GroupId, Message, NodeId, UserId};
use crate::pipeline::lanes::Lanes;
use crate::pipeline::{Admission, Pipeline};
use crate::routing::Route;
use crate::routing::bus::{Addressed, SendRequest};
use crate::routing::cache::CachedRoutes;

/// The services a peer request reaches.
pub(super) struct NodePeers {
    pub pipeline: Arc<Pipeline>,
    pub delivery: Arc<Delivery>,
    pub gateway: Arc<Gateway>,
    pub lanes: Arc<Lanes>,
    pub routes: Arc<CachedRoutes>,
    pub membership: Arc<Membership>,
}

#[async_trait]
impl PeerHandler for NodePeers {
    async fn admit_send(&self, request: SendRequest) -> Admission {
        self.pipeline.admit(request).await
    }

    async fn deliver(&self, message: Message, users: Vec<UserId>, addressed: Addressed) {
        self.delivery.deliver_here(&message, &users, addressed).await;
    }

    async fn publish_room(&self, message: Message) {
        self.delivery.push_to_room_here(&message).await;
    }

    async fn kick(&self, route: Route, hand_over: Option<NodeId>) -> Option<DeviceLedger> {
        match hand_over {
            Some(node) => self.gateway.hand_over(&route, node),
            None => {
                self.gateway.kick(&route);
                None
            }
        }
    }

    async fn lowest_in_flight(&self, conversation: ConversationId) -> Option<u64> {
        self.lanes.lowest_in_flight(&conversation)
    }

    async fn routes_changed(&self, users: Vec<UserId>) {
        self.routes.invalidate(&users);
    }

    async fn group_changed(&self, group: GroupId) {
        self.membership.forget(&group);
    }
}

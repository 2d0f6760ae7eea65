//! The Redis key layout of cluster mode, in one place (the table is in the module doc of
//! [`crate::cluster`]).
//!
//! Each key carries a hash tag naming what it belongs to — `{u:<user>}`, `{n:<node>}`,
//! `{r:<room>}` — so the keys one script or one step touches share a Redis Cluster slot.
//! The prefix comes before the tag and may not contain braces, or its braces would become
//! the tag and put every key in one slot.

use std::sync::Arc;

use crate::model::{ClientMsgId, ConversationId, NodeId, UserId};

/// A key prefix was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Redis key prefix {0:?} contains a brace; a prefix may not contain '{{' or '}}' (they would become the hash tag)"
)]
pub struct InvalidPrefix(pub String);

/// What every key of this deployment starts with, so that several deployments (or tests)
/// share one Redis without seeing each other's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPrefix(Arc<str>);

impl Default for KeyPrefix {
    fn default() -> Self {
        Self("herald:".into())
    }
}

impl KeyPrefix {
    /// A prefix such as `herald:` or `test:1f3a:`.
    ///
    /// # Errors
    /// [`InvalidPrefix`] when it contains `{` or `}`.
    pub fn new(prefix: &str) -> Result<Self, InvalidPrefix> {
        if prefix.contains(['{', '}']) {
            return Err(InvalidPrefix(prefix.to_owned()));
        }
        Ok(Self(prefix.into()))
    }

    /// The prefix as text (to scan for this deployment's keys).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `route:{u:<user>}`: the user's devices → where each is connected.
    pub(crate) fn route(&self, user: &UserId) -> String {
        format!("{}route:{{u:{user}}}", self.0)
    }

    /// `presence:{u:<user>}`: when the user's last device left (ms, Redis's clock).
    pub(crate) fn last_left(&self, user: &UserId) -> String {
        format!("{}presence:{{u:{user}}}", self.0)
    }

    /// `route:gw:{n:<node>}`: every route `node` wrote, for clearing them when it dies.
    pub(crate) fn gateway(&self, node: NodeId) -> String {
        format!("{}route:gw:{{n:{node}}}", self.0)
    }

    /// `dedup:{u:<user>}:<client_msg_id>`: the mark of one send.
    pub(crate) fn dedup(&self, sender: &UserId, client_msg_id: &ClientMsgId) -> String {
        format!("{}dedup:{{u:{sender}}}:{client_msg_id}", self.0)
    }

    /// `room:{r:<room>}:nodes`: the nodes with subscribers of a room (`<room>` without the
    /// `room:` of the conversation id).
    pub(crate) fn room_nodes(&self, room: &ConversationId) -> String {
        let name = room.as_str().strip_prefix("room:").unwrap_or(room.as_str());
        format!("{}room:{{r:{name}}}:nodes", self.0)
    }

    /// `node:{cluster}:leases`: a sorted set of the leased node ids, each scored by its
    /// lease's expiry in Redis's own clock (ms). One tag for every membership key, so each
    /// membership script touches one slot.
    pub(crate) fn node_leases(&self) -> String {
        format!("{}node:{{cluster}}:leases", self.0)
    }

    /// `node:{cluster}:holders`: a hash of node id → `<advertise>|<instance>|<client>`, who holds each
    /// lease and where peers reach it.
    pub(crate) fn node_holders(&self) -> String {
        format!("{}node:{{cluster}}:holders", self.0)
    }

    /// `node:{cluster}:epoch`: the counter every membership change increments, naming the
    /// ring in force.
    pub(crate) fn cluster_epoch(&self) -> String {
        format!("{}node:{{cluster}}:epoch", self.0)
    }

    /// `node:{cluster}:generation`: a random name of Redis's current data set, written by
    /// the first membership step after it was created or lost, so a node can tell a lease
    /// Redis forgot from one that lapsed.
    pub(crate) fn cluster_generation(&self) -> String {
        format!("{}node:{{cluster}}:generation", self.0)
    }

    /// `node:{cluster}:clients`: a hash of node id → the URL clients reach that node at, read
    /// by a draining node to tell its clients where to go. Tagged like the membership keys,
    /// whose node ids it follows.
    pub(crate) fn node_clients(&self) -> String {
        format!("{}node:{{cluster}}:clients", self.0)
    }

    /// `ledger:{a:<client>:<slot>}`: a hash of `<user>|<device>` → the saved ledger
    /// (`SavedLedger`) of a device held by the node clients reach at `<client>` (its
    /// `host:port`, which a restart keeps where the node id may change), for one of its
    /// [`LEDGER_SLOTS`](super::redis_ledgers::LEDGER_SLOTS) slots.
    pub(crate) fn ledgers(&self, client: &str, slot: u32) -> String {
        format!("{}ledger:{{a:{client}:{slot}}}", self.0)
    }

    /// `ledger:{a:<client>}:as_of`: when the ledgers of that node were last all true (ms
    /// since the Unix epoch, the node's clock).
    pub(crate) fn ledgers_as_of(&self, client: &str) -> String {
        format!("{}ledger:{{a:{client}}}:as_of", self.0)
    }

    /// `node:{cluster}:settings`: the settings every node of the cluster must share
    /// (`cluster.virtual_nodes`, `cluster.placement`), written by a join that finds no live
    /// node and compared by every other join.
    pub(crate) fn cluster_settings(&self) -> String {
        format!("{}node:{{cluster}}:settings", self.0)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The part of a key Redis Cluster hashes: the text inside the first `{…}`.
    pub(crate) fn hash_tag(key: &str) -> &str {
        let open = key.find('{').expect("a tag");
        let close = key[open..].find('}').expect("a closed tag") + open;
        &key[open + 1..close]
    }

    #[test]
    fn keys_of_one_user_share_a_slot_and_follow_the_layout() {
        let keys = KeyPrefix::default();
        let ann = UserId::parse("ann").expect("valid");
        let id = ClientMsgId::parse("00000000-0000-4000-8000-000000000001").expect("valid");
        let route = keys.route(&ann);
        let dedup = keys.dedup(&ann, &id);
        assert_eq!(route, "herald:route:{u:ann}");
        assert_eq!(dedup, "herald:dedup:{u:ann}:00000000-0000-4000-8000-000000000001");
        assert_eq!(hash_tag(&route), hash_tag(&dedup));
        assert_eq!(keys.gateway(NodeId(7)), "herald:route:gw:{n:7}");
        let lobby = ConversationId::parse("room:lobby").expect("valid");
        assert_eq!(keys.room_nodes(&lobby), "herald:room:{r:lobby}:nodes");
    }

    #[test]
    fn membership_keys_share_one_slot() {
        let keys = KeyPrefix::default();
        let all = [
            keys.node_leases(),
            keys.node_holders(),
            keys.cluster_epoch(),
            keys.cluster_generation(),
            keys.node_clients(),
        ];
        assert_eq!(all[0], "herald:node:{cluster}:leases");
        assert!(all.iter().all(|key| hash_tag(key) == "cluster"), "{all:?}");
    }

    #[test]
    fn a_prefix_with_a_brace_is_refused() {
        assert!(KeyPrefix::new("test:{x}:").is_err());
        assert_eq!(KeyPrefix::new("test:1f3a:").expect("valid").as_str(), "test:1f3a:");
    }
}

//! The consistent-hash ring: which node owns a routing key (ARCHITECTURE.md §2, step 2).
//!
//! Each node sits on the ring at `virtual_nodes` points, CRC32 of `"<node>#<i>"`; a key
//! belongs to the first point at or after CRC32 of the key, wrapping around. Every node that
//! knows the same members builds the same ring, so they agree on owners without talking;
//! adding or removing a node moves only the keys next to its points.
//!
//! The key itself comes from the `route-key` hook (default: the conversation for sends, the
//! user otherwise). In embedded mode the ring has one member, this node; the ring in force
//! is held by [`Topology`](super::topology::Topology).

/// Points per node unless configured otherwise.
pub const DEFAULT_VIRTUAL_NODES: u32 = 160;

/// A ring over a set of node ids.
#[derive(Debug, Clone)]
pub struct Ring {
    /// (point, node), sorted by point.
    points: Vec<(u32, u32)>,
}

impl Ring {
    /// A ring over `nodes` (duplicates ignored), each at `virtual_nodes` points (at least 1).
    pub fn new(nodes: &[u32], virtual_nodes: u32) -> Self {
        let mut members = nodes.to_vec();
        members.sort_unstable();
        members.dedup();
        let mut points: Vec<(u32, u32)> = members
            .iter()
            .flat_map(|&node| {
                (0..virtual_nodes.max(1)).map(move |i| (crc32fast::hash(format!("{node}#{i}").as_bytes()), node))
            })
            .collect();
        // Ties between nodes (rare CRC collisions) go to the lower node id, on every node.
        points.sort_unstable();
        points.dedup_by_key(|(point, _)| *point);
        Self { points }
    }

    /// The node owning `key`, or `None` for an empty ring.
    pub fn owner(&self, key: &str) -> Option<u32> {
        let hash = crc32fast::hash(key.as_bytes());
        let at = self.points.partition_point(|&(point, _)| point < hash);
        self.points.get(at).or_else(|| self.points.first()).map(|&(_, node)| node)
    }

    /// How many points `node` holds on the ring.
    pub fn points_of(&self, node: u32) -> usize {
        self.points.iter().filter(|&&(_, owner)| owner == node).count()
    }

    /// The distinct nodes on the ring.
    pub fn nodes(&self) -> Vec<u32> {
        let mut nodes: Vec<u32> = self.points.iter().map(|&(_, node)| node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> impl Iterator<Item = String> {
        (0..10_000).map(|i| format!("room:r{i}"))
    }

    #[test]
    fn one_node_owns_everything_and_an_empty_ring_nothing() {
        let ring = Ring::new(&[7], DEFAULT_VIRTUAL_NODES);
        assert!(keys().all(|key| ring.owner(&key) == Some(7)));
        assert_eq!(Ring::new(&[], DEFAULT_VIRTUAL_NODES).owner("dm:a:b"), None);
    }

    #[test]
    fn nodes_agree_whatever_order_they_list_members_in() {
        let a = Ring::new(&[1, 2, 3], DEFAULT_VIRTUAL_NODES);
        let b = Ring::new(&[3, 1, 2, 2], DEFAULT_VIRTUAL_NODES);
        assert!(keys().all(|key| a.owner(&key) == b.owner(&key)));
        assert_eq!(a.nodes(), vec![1, 2, 3]);
        assert_eq!((1..=3).map(|node| a.points_of(node)).sum::<usize>(), a.points.len());
    }

    #[test]
    fn keys_spread_over_nodes_and_a_leaving_node_moves_only_its_own() {
        let three = Ring::new(&[1, 2, 3], DEFAULT_VIRTUAL_NODES);
        let mut counts = [0usize; 4];
        for key in keys() {
            counts[three.owner(&key).unwrap_or(0) as usize] += 1;
        }
        for node in 1..=3 {
            assert!((2500..4200).contains(&counts[node]), "node {node} owns {} of 10000: {counts:?}", counts[node]);
        }
        let two = Ring::new(&[1, 2], DEFAULT_VIRTUAL_NODES);
        for key in keys() {
            let before = three.owner(&key);
            if before != Some(3) {
                assert_eq!(two.owner(&key), before, "{key} moved though its node stayed");
            }
        }
    }

    #[test]
    fn a_fourth_node_joining_three_takes_about_a_quarter_of_the_conversations() {
        // Consistent hashing moves only what the new node takes: at most 1.1 × the ideal 1/4
        // of 100,000 conversations move (each move makes an owner change and a lease), every
        // one of them to the new node; and the new node takes a fair share, not a sliver.
        let conversations: Vec<String> =
            (0..100_000).map(|i| format!("dm:user-{:06}:user-{:06}", 2 * i, 2 * i + 1)).collect();
        for (members, joining) in [([1, 2, 3], 4), ([0, 1, 2], 3)] {
            let three = Ring::new(&members, DEFAULT_VIRTUAL_NODES);
            let four = Ring::new(&[members[0], members[1], members[2], joining], DEFAULT_VIRTUAL_NODES);
            let mut moved = 0usize;
            for conversation in &conversations {
                let (before, after) = (three.owner(conversation), four.owner(conversation));
                if before != after {
                    assert_eq!(after, Some(joining), "{conversation} moved between nodes that stayed");
                    moved += 1;
                }
            }
            let share = moved as f64 / conversations.len() as f64;
            assert!((0.2..=0.275).contains(&share), "node {joining} joining {members:?} moved {share:.4} of the keys");
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::Ring;

        fn members() -> impl Strategy<Value = Vec<u32>> {
            proptest::collection::btree_set(0u32..1024, 1..8).prop_map(|set| set.into_iter().collect())
        }

        fn keys() -> impl Strategy<Value = Vec<String>> {
            proptest::collection::vec("[a-z]{1,4}:[a-z0-9._@-]{1,24}", 1..64)
        }

        proptest! {
            #[test]
            fn every_key_has_one_owner_among_the_members_whatever_their_order(
                nodes in members(), keys in keys(), points in 1u32..200
            ) {
                let ring = Ring::new(&nodes, points);
                let mut reversed = nodes.clone();
                reversed.reverse();
                let again = Ring::new(&reversed, points);
                for key in &keys {
                    let owner = ring.owner(key);
                    prop_assert!(owner.is_some_and(|owner| nodes.contains(&owner)));
                    prop_assert_eq!(owner, again.owner(key), "nodes listing members differently disagree");
                }
            }

            #[test]
            fn a_joining_node_takes_keys_only_for_itself_and_a_leaving_one_gives_up_only_its_own(
                nodes in members(), joining in 0u32..1024, keys in keys()
            ) {
                prop_assume!(!nodes.contains(&joining));
                let before = Ring::new(&nodes, super::super::DEFAULT_VIRTUAL_NODES);
                let mut grown = nodes.clone();
                grown.push(joining);
                let after = Ring::new(&grown, super::super::DEFAULT_VIRTUAL_NODES);
                for key in &keys {
                    let (old, new) = (before.owner(key), after.owner(key));
                    prop_assert!(old == new || new == Some(joining), "{} moved from {:?} to {:?}", key, old, new);
                }
                // Leaving is the same change the other way round.
                for key in &keys {
                    if after.owner(key) != Some(joining) {
                        prop_assert_eq!(before.owner(key), after.owner(key));
                    }
                }
            }
        }
    }
}

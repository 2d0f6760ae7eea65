//! The node's in-memory maps: the hasher they share, and their upkeep.
//!
//! **Hasher.** The maps a message passes through (connections, sessions, routes, rooms,
//! retries, acked positions) hash with foldhash rather than the standard SipHash: at a
//! steady 10k msgs/s hashing fell from 1.1 % to 0.6 % of the node's time (`perf`), what
//! is left being mostly the dedup fingerprints' SipHash. Their keys are user and conversation
//! names a client chooses, so the hasher stays keyed: foldhash's `RandomState` draws its seed
//! at random per process and per map, and a client cannot aim collisions at a seed it never
//! sees. Where a hash must resist more than that (the dedup fingerprints that stand for a
//! whole (sender, client_msg_id)), SipHash with secret keys stays (`pipeline/dedup.rs`).
//!
//! **Upkeep.** A hash map keeps the room it grew to: after 10,000 devices left, the maps of
//! connections, sessions and routes held room for 10,000 each until the process ended.
//! [`shrink_if_sparse`] gives it back.

use std::hash::Hash;

/// The keyed, fast hasher of the maps above.
pub type Keyed = foldhash::fast::RandomState;
/// A `std` hash map with the [`Keyed`] hasher; build it with `default()`.
pub type HashMap<K, V> = std::collections::HashMap<K, V, Keyed>;
/// A `std` hash set with the [`Keyed`] hasher; build it with `default()`.
pub type HashSet<K> = std::collections::HashSet<K, Keyed>;
/// A concurrent map with the [`Keyed`] hasher; build it with `default()`.
pub type DashMap<K, V> = dashmap::DashMap<K, V, Keyed>;

/// Room for this many entries is always kept, so a small node never reallocates.
const KEEP: usize = 1024;

/// Shrinks `map` to fit when it uses less than a quarter of its room (and holds more
/// room than [`KEEP`]). Each shard is locked while it is rehashed; call it now and then,
/// not on a hot path.
pub fn shrink_if_sparse<K: Eq + Hash + Clone, V>(map: &DashMap<K, V>) {
    if is_sparse(map.len(), map.capacity(), KEEP) {
        map.shrink_to_fit();
    }
}

/// Whether a collection holding `len` in room for `capacity` should give room back: it
/// uses less than a quarter of it, and more than `keep` is held. Shrinking then, to about
/// twice what is used, means a shrink is paid for by the removals since the last one.
pub fn is_sparse(len: usize, capacity: usize, keep: usize) -> bool {
    capacity > keep.max(len.saturating_mul(4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_emptied_after_a_crowd_gives_its_room_back_and_a_busy_one_keeps_it() {
        let map = DashMap::default();
        for key in 0..20_000u32 {
            map.insert(key, key);
        }
        let grown = map.capacity();
        shrink_if_sparse(&map);
        assert_eq!(map.capacity(), grown, "a full map is left alone");
        map.retain(|key, _| *key < 100);
        shrink_if_sparse(&map);
        assert!(map.capacity() < grown / 10, "room for {} kept with 100 entries", map.capacity());
        assert_eq!(map.len(), 100, "no entry lost");
    }
}

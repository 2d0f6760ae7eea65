//! Home nodes: the node nginx sends a user's connections to, computed by Herald itself.
//!
//! With `cluster.placement` set to an nginx mode, nginx sits in front of the cluster with
//! `hash $arg_user consistent;` (or plain `hash $arg_user;`) over an upstream that lists
//! every live node's client address (`host:port` of its `cluster.client_url`) in the order
//! of node ids, and clients put `?user=<user>` on the WebSocket URL. Herald rebuilds that
//! upstream from the membership in force and picks as nginx's
//! `ngx_http_upstream_hash_module.c` does, so every node names the same home for a user,
//! and the same as nginx — a device reconnecting lands where its parked session waits.
//!
//! - **consistent** (ketama): each server gets 160 points (weight 1), the first CRC32 of
//!   `host "\0" port` followed by 4 zero bytes, each next one of the same prefix followed by
//!   the previous point (little-endian). Points are sorted, equal points kept once; a key
//!   belongs to the first point at or above CRC32 of the key, wrapping to the first.
//! - **plain hash**: `((crc32(key) >> 16) & 0x7fff) % n`; when that server is down, nginx
//!   adds `((crc32("<try>" key) >> 16) & 0x7fff)` to the running sum and tries again, up to
//!   20 times, then falls back to round robin.
//!
//! Invariant: [`Homes::home`] depends only on the placement and the ordered upstream, which
//! [`Homes::digest`] names; nodes at one ring epoch hold the same upstream, so they agree.
//! One case cannot be matched: two servers' points colliding (a CRC32 tie, about one
//! chance in ten thousand for seven servers), where nginx's unstable sort keeps either.

use sha2::{Digest, Sha256};

use crate::config::Placement;
use crate::model::NodeId;

/// Points nginx gives a server of weight 1 on its consistent-hash ring.
const POINTS_PER_SERVER: usize = 160;
/// nginx's plain hash stops rehashing after this many tries and falls back to round robin.
const MAX_TRIES: u32 = 20;

/// The homes under one membership: the placement, and nginx's upstream as Herald builds it.
#[derive(Debug, Clone)]
pub struct Homes {
    /// Which nginx mode picks (or none).
    placement: Placement,
    /// (node, client address) of every live node with a client address, by node id: the
    /// `server` lines of nginx's upstream, in order.
    upstream: Vec<(NodeId, String)>,
    /// The consistent mode's ring: (point, index into `upstream`), sorted by point.
    points: Vec<(u32, usize)>,
    /// Names the placement and the ordered upstream (see [`digest`](Self::digest)).
    digest: String,
}

impl Homes {
    /// No placement: users have no home.
    pub fn none() -> Self {
        Self::new(Placement::None, Vec::new())
    }

    /// The homes `placement` gives over `upstream` ((node, `host:port`); sorted here by
    /// node id, duplicates of a node dropped).
    pub fn new(placement: Placement, mut upstream: Vec<(NodeId, String)>) -> Self {
        upstream.sort_by_key(|(node, _)| *node);
        upstream.dedup_by_key(|(node, _)| *node);
        let points = match placement {
            Placement::NginxConsistent => {
                ketama_points(&upstream.iter().map(|(_, address)| address.as_str()).collect::<Vec<_>>())
            }
            Placement::None | Placement::NginxHash => Vec::new(),
        };
        let digest = digest(placement, &upstream);
        Self { placement, upstream, points, digest }
    }

    /// The placement in force.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// nginx's upstream: (node, client address) in the order of node ids.
    pub fn upstream(&self) -> &[(NodeId, String)] {
        &self.upstream
    }

    /// A short hash of the placement and the ordered upstream: `herald cluster nginx-conf`
    /// has nginx send it on every request, so a node can tell a stale nginx config from a
    /// current one.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The node nginx sends `user`'s connections to; `None` without placement or nodes.
    pub fn home(&self, user: &str) -> Option<NodeId> {
        self.home_entry(user).map(|(node, _)| *node)
    }

    /// The client address (`host:port`) of `user`'s home node, as nginx's upstream lists
    /// it; `None` as for [`home`](Self::home). A node restarted at the same address is the
    /// same home, whatever its node id.
    pub fn home_address(&self, user: &str) -> Option<&str> {
        self.home_entry(user).map(|(_, address)| address.as_str())
    }

    fn home_entry(&self, user: &str) -> Option<&(NodeId, String)> {
        let index = match self.placement {
            Placement::None => return None,
            Placement::NginxConsistent => consistent_pick(&self.points, user)?,
            Placement::NginxHash => hash_pick(user, self.upstream.len(), |_| false)?,
        };
        self.upstream.get(index)
    }
}

/// nginx's consistent-hash ring over `servers` (each as written in its `server` line):
/// (point, index of the server), sorted, equal points kept once (the earlier server's).
pub fn ketama_points(servers: &[&str]) -> Vec<(u32, usize)> {
    let mut points = Vec::with_capacity(servers.len() * POINTS_PER_SERVER);
    for (index, server) in servers.iter().enumerate() {
        let (host, port) = split_server(server);
        let mut base = crc32fast::Hasher::new();
        base.update(host.as_bytes());
        base.update(&[0]);
        base.update(port.as_bytes());
        let mut previous = 0u32;
        for _ in 0..POINTS_PER_SERVER {
            let mut hash = base.clone();
            hash.update(&previous.to_le_bytes());
            previous = hash.finalize();
            points.push((previous, index));
        }
    }
    points.sort_by_key(|&(point, _)| point);
    points.dedup_by_key(|&mut (point, _)| point);
    points
}

/// The server nginx's consistent mode picks for `key` on `points`; `None` for no points.
pub fn consistent_pick(points: &[(u32, usize)], key: &str) -> Option<usize> {
    let hash = crc32fast::hash(key.as_bytes());
    let at = points.partition_point(|&(point, _)| point < hash);
    points.get(at).or_else(|| points.first()).map(|&(_, server)| server)
}

/// The server nginx's plain `hash` picks for `key` among `servers` of weight 1, skipping
/// those `down` says are down; `None` where nginx would fall back to round robin (no server,
/// an empty key, or 20 rehashes landing on down servers). One server is always picked.
pub fn hash_pick(key: &str, servers: usize, down: impl Fn(usize) -> bool) -> Option<usize> {
    match servers {
        0 => return None,
        1 => return Some(0),
        _ if key.is_empty() => return None,
        _ => {}
    }
    let mut sum: u64 = 0;
    for rehash in 0..=MAX_TRIES {
        let mut hash = crc32fast::Hasher::new();
        if rehash > 0 {
            hash.update(rehash.to_string().as_bytes());
        }
        hash.update(key.as_bytes());
        sum += u64::from((hash.finalize() >> 16) & 0x7fff);
        let server = usize::try_from(sum % servers as u64).unwrap_or(0);
        if !down(server) {
            return Some(server);
        }
    }
    None
}

/// A `server` line's host and port as nginx splits them before hashing: the port is the
/// digits after the last `:` (none for `unix:` sockets or when no digits end the name).
fn split_server(server: &str) -> (&str, &str) {
    if server.len() >= 5 && server[..5].eq_ignore_ascii_case("unix:") {
        return (&server[5..], "");
    }
    let digits = server.bytes().rev().take_while(u8::is_ascii_digit).count();
    let end = server.len() - digits;
    match server[..end].strip_suffix(':') {
        Some(host) => (host, &server[end..]),
        None => (server, ""),
    }
}

/// The first 16 hex digits of SHA-256 over the placement and `node=address` lines.
fn digest(placement: Placement, upstream: &[(NodeId, String)]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(placement.name().as_bytes());
    for (node, address) in upstream {
        hasher.update(format!("\n{node}={address}").as_bytes());
    }
    hasher.finalize().iter().take(8).map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(addresses: &[&str]) -> Vec<(NodeId, String)> {
        addresses.iter().enumerate().map(|(i, a)| (NodeId(i as u32), (*a).to_owned())).collect()
    }

    #[test]
    fn a_server_line_splits_as_nginx_splits_it() {
        assert_eq!(split_server("127.0.0.1:7070"), ("127.0.0.1", "7070"));
        assert_eq!(split_server("[::1]:7070"), ("[::1]", "7070"));
        assert_eq!(split_server("node-1.example.com"), ("node-1.example.com", ""));
        assert_eq!(split_server("unix:/run/herald.sock"), ("/run/herald.sock", ""));
        assert_eq!(split_server("host:"), ("host", ""));
    }

    #[test]
    fn ketama_points_are_chained_crc32s_of_host_nul_port() {
        // Worked by hand from the module doc: the first point of "a:1" is CRC32 of
        // "a" 0x00 "1" 0x00 0x00 0x00 0x00; the second feeds the first back, little-endian.
        let first = crc32fast::hash(b"a\x001\x00\x00\x00\x00");
        let mut second = b"a\x001".to_vec();
        second.extend_from_slice(&first.to_le_bytes());
        let second = crc32fast::hash(&second);
        let points = ketama_points(&["a:1"]);
        assert_eq!(points.len(), 160);
        assert!(points.contains(&(first, 0)) && points.contains(&(second, 0)));
        assert!(points.windows(2).all(|pair| pair[0].0 < pair[1].0), "sorted and distinct");
    }

    #[test]
    fn a_key_goes_to_the_first_point_at_or_above_its_hash_wrapping_around() {
        let points = vec![(100, 0), (200, 1), (300, 2)];
        let key = "user-1";
        let hash = crc32fast::hash(key.as_bytes());
        let expected = [(100, 0), (200, 1), (300, 2)].iter().find(|(p, _)| *p >= hash).map_or(0, |(_, s)| *s);
        assert_eq!(consistent_pick(&points, key), Some(expected));
        // Above every point: the first. Exactly on a point: that point.
        let high = vec![(0, 4), (1, 5)];
        assert_eq!(consistent_pick(&high, key), Some(4));
        assert_eq!(consistent_pick(&[(hash, 9), (hash.wrapping_add(1), 3)], key), Some(9));
        assert_eq!(consistent_pick(&[], key), None);
    }

    #[test]
    fn the_plain_hash_is_the_high_half_of_crc32_modulo_the_servers() {
        for key in ["alice", "bob", "user-42", "x"] {
            let expected = ((crc32fast::hash(key.as_bytes()) >> 16) & 0x7fff) as usize % 3;
            assert_eq!(hash_pick(key, 3, |_| false), Some(expected), "{key}");
        }
        // "alice": crc32 0x278ebc47 → 0x278e = 10126 → 10126 % 3 = 1, % 4 = 2.
        assert_eq!(crc32fast::hash(b"alice"), 0x278e_bc47);
        assert_eq!(hash_pick("alice", 3, |_| false), Some(1));
        assert_eq!(hash_pick("alice", 4, |_| false), Some(2));
        assert_eq!(hash_pick("alice", 1, |_| true), Some(0), "one server is always picked");
        assert_eq!(hash_pick("", 3, |_| false), None, "an empty key goes round robin");
    }

    #[test]
    fn a_down_server_sends_the_key_to_the_rehash_of_try_and_key() {
        let first = hash_pick("alice", 4, |_| false).expect("picked");
        let sum = u64::from((crc32fast::hash(b"alice") >> 16) & 0x7fff)
            + u64::from((crc32fast::hash(b"1alice") >> 16) & 0x7fff);
        let second = (sum % 4) as usize;
        if second != first {
            assert_eq!(hash_pick("alice", 4, |server| server == first), Some(second));
        }
        assert_eq!(hash_pick("alice", 4, |_| true), None, "every server down: round robin");
    }

    #[test]
    fn homes_follow_the_placement_and_the_digest_names_the_upstream() {
        let servers = ["127.0.0.1:7070", "127.0.0.1:7080", "127.0.0.1:7090"];
        let none = Homes::new(Placement::None, upstream(&servers));
        assert_eq!(none.home("alice"), None);
        let consistent = Homes::new(Placement::NginxConsistent, upstream(&servers));
        let points = ketama_points(&servers);
        for user in ["alice", "bob", "carol"] {
            let index = consistent_pick(&points, user).expect("a server");
            assert_eq!(consistent.home(user), Some(NodeId(index as u32)));
        }
        // Known picks, worked out apart from this code (a few lines of Python over zlib.crc32).
        for (user, node) in [("alice", 0), ("bob", 1), ("carol", 0), ("dave", 2), ("erin", 0), ("user-1", 1)] {
            assert_eq!(consistent.home(user), Some(NodeId(node)), "consistent: {user}");
        }
        let hash = Homes::new(Placement::NginxHash, upstream(&servers));
        for (user, node) in [("alice", 1), ("bob", 2), ("carol", 0), ("dave", 0), ("erin", 1), ("user-1", 2)] {
            assert_eq!(hash.home(user), Some(NodeId(node)), "plain hash: {user}");
        }
        let mut reversed = upstream(&servers);
        reversed.reverse();
        assert_eq!(Homes::new(Placement::NginxHash, reversed).digest(), hash.digest(), "ordered by node id");
        assert_ne!(hash.digest(), consistent.digest(), "the mode is part of the digest");
        assert_ne!(Homes::new(Placement::NginxHash, upstream(&servers[..2])).digest(), hash.digest());
        assert_eq!(hash.digest().len(), 16);
    }

    #[test]
    fn a_joining_server_takes_about_a_quarter_in_consistent_mode_and_most_in_plain() {
        let three = ["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"];
        let four = ["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070", "10.0.0.4:7070"];
        let users: Vec<String> = (0..20_000).map(|i| format!("user-{i}")).collect();
        let moved = |placement| {
            let (before, after) = (Homes::new(placement, upstream(&three)), Homes::new(placement, upstream(&four)));
            let moved: Vec<_> = users.iter().filter(|user| before.home(user) != after.home(user)).collect();
            (moved.len() as f64 / users.len() as f64, moved.iter().all(|user| after.home(user) == Some(NodeId(3))))
        };
        let (share, all_to_the_new_one) = moved(Placement::NginxConsistent);
        assert!((0.15..0.35).contains(&share) && all_to_the_new_one, "consistent: {share}");
        let (share, _) = moved(Placement::NginxHash);
        assert!(share > 0.6, "plain hash: {share}");
    }
}

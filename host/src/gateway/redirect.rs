//! Where a draining node sends its clients: the `reconnect_url` of each `go_away`.
//!
//! The node hands the gateway the client URLs of the other live nodes when it starts to
//! drain (cluster mode; none in embedded mode, or when they cannot be read in time), and
//! each connection's `go_away` names one of them, picked by a hash of its user id over the
//! sorted URLs. So every device of a user lands on the same node (a multi-device user's
//! fan-out stays on one node), the users spread evenly over the candidates, and the choice
//! is the same on every node and every run (CRC32, as the ring). With no candidate the
//! `go_away` names none and the client returns to the address it used, where a load
//! balancer picks a node.

use crate::model::UserId;

/// The client URLs a draining node may send its clients to; empty: none, the clients
/// reconnect to the same address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redirects {
    /// Sorted and without duplicates, so the pick depends on the set only, not on the order
    /// Redis listed it in.
    urls: Vec<String>,
}

impl Redirects {
    /// The candidates `urls` (in any order; empty strings and repeats are dropped).
    pub fn new(urls: impl IntoIterator<Item = String>) -> Self {
        let mut urls: Vec<String> = urls.into_iter().filter(|url| !url.is_empty()).collect();
        urls.sort_unstable();
        urls.dedup();
        Self { urls }
    }

    /// No candidate: every client reconnects to the same address.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether there is no candidate.
    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// The URL `user`'s connections are sent to, or `None` when there is no candidate.
    pub fn pick(&self, user: &UserId) -> Option<&str> {
        if self.urls.is_empty() {
            return None;
        }
        let at = crc32fast::hash(user.as_str().as_bytes()) as usize % self.urls.len();
        Some(&self.urls[at])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserId {
        UserId::parse(name).expect("valid user")
    }

    fn three() -> Redirects {
        Redirects::new(["ws://b/v1/ws", "ws://c/v1/ws", "ws://a/v1/ws"].map(str::to_owned))
    }

    #[test]
    fn a_user_always_gets_the_same_url_whatever_order_the_candidates_came_in() {
        let reversed =
            Redirects::new(["ws://a/v1/ws", "ws://a/v1/ws", "", "ws://c/v1/ws", "ws://b/v1/ws"].map(str::to_owned));
        assert_eq!(reversed, three(), "sorted, repeats and empties dropped");
        for n in 0..200 {
            let ann = user(&format!("ann{n}"));
            assert_eq!(three().pick(&ann), reversed.pick(&ann));
            assert_eq!(three().pick(&ann), three().pick(&ann));
        }
        // CRC32 is fixed: the pick is the same on every node and every run.
        assert_eq!(three().pick(&user("alice")), Some("ws://c/v1/ws"));
    }

    #[test]
    fn users_spread_evenly_over_the_candidates() {
        let redirects = three();
        let mut counts = std::collections::BTreeMap::new();
        for n in 0..3_000 {
            let url = redirects.pick(&user(&format!("user-{n}"))).expect("a candidate");
            *counts.entry(url.to_owned()).or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 3, "every candidate gets users: {counts:?}");
        assert!(counts.values().all(|&count| (850..=1150).contains(&count)), "about a third each: {counts:?}");
    }

    #[test]
    fn no_candidate_picks_nothing() {
        assert_eq!(Redirects::none().pick(&user("ann")), None);
        assert!(Redirects::new([String::new()]).is_empty());
        let one = Redirects::new(["wss://only/v1/ws".to_owned()]);
        assert_eq!(one.pick(&user("ann")), Some("wss://only/v1/ws"));
    }
}

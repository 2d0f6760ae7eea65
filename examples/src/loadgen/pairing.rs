//! Where each simulated user connects and whom it talks to, when a run targets several
//! endpoints (the nodes of a cluster).
//!
//! Users are spread over the endpoints round-robin: user `i` connects to endpoint
//! `i mod N`. Pairs are fixed before the run. By default user `2k` pairs with `2k + 1`, as
//! with one endpoint, so with two or more endpoints every pair crosses (consecutive users
//! are on different endpoints). [`Pairing::with_cross_share`] instead builds pairs so that
//! at least a given share of them cross — as few more as the endpoints' sizes allow — and
//! the rest have both users on one endpoint. The construction is deterministic: the same
//! settings give the same pairs.

use std::collections::VecDeque;

/// The endpoint (index into the run's URLs) of user `index` when there are `endpoints`.
pub fn endpoint_of(index: usize, endpoints: usize) -> usize {
    index % endpoints.max(1)
}

/// Who pairs with whom, and which pairs cross endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pairing {
    /// The partner of each user, by index.
    partners: Vec<usize>,
    /// Endpoints the users are spread over.
    endpoints: usize,
}

/// Why no pairing fits the settings.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PairingError {
    /// Pairs need an even number of users.
    #[error("users must be an even number (they pair up), not {0}")]
    OddUsers(usize),
    /// The share is not a fraction.
    #[error("--cross-node-share must be between 0 and 1, not {0}")]
    Share(f64),
    /// A pair cannot cross with one endpoint.
    #[error("--cross-node-share {0} needs at least two endpoints (give several --url)")]
    OneEndpoint(f64),
}

impl Pairing {
    /// User `2k` with `2k + 1`, whatever endpoints they are on.
    ///
    /// # Errors
    ///
    /// [`PairingError::OddUsers`] for an odd number of users.
    pub fn neighbours(users: usize, endpoints: usize) -> Result<Self, PairingError> {
        if !users.is_multiple_of(2) {
            return Err(PairingError::OddUsers(users));
        }
        Ok(Self { partners: (0..users).map(|index| index ^ 1).collect(), endpoints: endpoints.max(1) })
    }

    /// Pairs such that at least `share` of them (rounded up to whole pairs) join users on
    /// different endpoints, and as few more as possible.
    ///
    /// Same-endpoint pairs are taken first, each from the endpoint with the most users
    /// left, which keeps the endpoints' remaining users balanced; then the endpoint with
    /// the most users left is paired with the one with the next most, which joins every
    /// remaining user across endpoints as long as no endpoint holds more than half of them.
    /// When that fails by a pair (two endpoints left one pair apart), one same-endpoint
    /// pair fewer is tried, so the share is never missed.
    ///
    /// # Errors
    ///
    /// [`PairingError`] for an odd number of users, a share outside 0..=1, or a share
    /// above 0 with one endpoint.
    pub fn with_cross_share(users: usize, endpoints: usize, share: f64) -> Result<Self, PairingError> {
        if !users.is_multiple_of(2) {
            return Err(PairingError::OddUsers(users));
        }
        if !(0.0..=1.0).contains(&share) {
            return Err(PairingError::Share(share));
        }
        let endpoints = endpoints.max(1);
        let pairs = users / 2;
        let wanted = wanted_cross_pairs(pairs, share);
        if endpoints == 1 {
            return if wanted == 0 { Self::neighbours(users, 1) } else { Err(PairingError::OneEndpoint(share)) };
        }
        let mut same = pairs - wanted;
        loop {
            let pairing = Self::build(users, endpoints, same);
            // With no same-endpoint pairs every pair crosses: round-robin leaves no
            // endpoint with more than half the users, so `same == 0` always ends the loop.
            if pairing.cross_pairs() >= wanted || same == 0 {
                return Ok(pairing);
            }
            same -= 1;
        }
    }

    /// `same` same-endpoint pairs (fewer if no endpoint has two users left), then as many
    /// crossing pairs as possible, then whatever is left within its endpoint.
    fn build(users: usize, endpoints: usize, same: usize) -> Self {
        let mut left: Vec<VecDeque<usize>> =
            (0..endpoints).map(|endpoint| (endpoint..users).step_by(endpoints).collect()).collect();
        let mut partners = vec![usize::MAX; users];
        let mut join = |one: usize, other: usize| {
            partners[one] = other;
            partners[other] = one;
        };
        // The endpoint with the most users left; ties go to the lowest endpoint.
        let fullest = |left: &[VecDeque<usize>], except: Option<usize>| {
            (0..left.len())
                .filter(|&endpoint| Some(endpoint) != except)
                .max_by_key(|&endpoint| (left[endpoint].len(), std::cmp::Reverse(endpoint)))
        };
        for _ in 0..same {
            let Some(endpoint) = fullest(&left, None).filter(|&endpoint| left[endpoint].len() >= 2) else {
                break;
            };
            if let (Some(one), Some(other)) = (left[endpoint].pop_front(), left[endpoint].pop_front()) {
                join(one, other);
            }
        }
        while let Some(first) = fullest(&left, None)
            && let Some(second) = fullest(&left, Some(first))
            && let (Some(one), Some(other)) = (left[first].front().copied(), left[second].front().copied())
        {
            left[first].pop_front();
            left[second].pop_front();
            join(one, other);
        }
        // Only one endpoint can have users left here; they pair among themselves.
        for endpoint in &mut left {
            while let (Some(one), Some(other)) = (endpoint.pop_front(), endpoint.pop_front()) {
                join(one, other);
            }
        }
        Self { partners, endpoints }
    }

    /// The partner of user `index`.
    pub fn partner(&self, index: usize) -> usize {
        self.partners[index]
    }

    /// Whether user `index` and its partner are on different endpoints.
    pub fn crosses(&self, index: usize) -> bool {
        endpoint_of(index, self.endpoints) != endpoint_of(self.partners[index], self.endpoints)
    }

    /// How many pairs there are.
    pub fn pairs(&self) -> usize {
        self.partners.len() / 2
    }

    /// How many pairs join users on different endpoints.
    pub fn cross_pairs(&self) -> usize {
        (0..self.partners.len()).filter(|&index| index < self.partners[index] && self.crosses(index)).count()
    }
}

/// `share` of `pairs`, rounded up to a whole pair (a product like 0.3 × 10 that lands a
/// hair above a whole number still counts as that number).
fn wanted_cross_pairs(pairs: usize, share: f64) -> usize {
    // Within 0 ..= pairs, so the cast keeps the value.
    let wanted = (share * pairs as f64 - 1e-9).ceil().max(0.0) as usize;
    wanted.min(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every user has one partner, not itself, who has it as partner.
    fn assert_is_a_pairing(pairing: &Pairing, users: usize) {
        assert_eq!(pairing.partners.len(), users);
        for index in 0..users {
            let partner = pairing.partner(index);
            assert!(partner < users && partner != index, "user {index} paired with {partner}");
            assert_eq!(pairing.partner(partner), index, "pairs are mutual");
            assert_eq!(pairing.crosses(index), pairing.crosses(partner));
        }
    }

    #[test]
    fn users_are_spread_over_endpoints_round_robin() {
        let endpoints: Vec<usize> = (0..7).map(|index| endpoint_of(index, 3)).collect();
        assert_eq!(endpoints, [0, 1, 2, 0, 1, 2, 0]);
        assert!((0..100).all(|index| endpoint_of(index, 1) == 0));
        assert_eq!(endpoint_of(5, 0), 0, "no endpoints counts as one");
    }

    #[test]
    fn neighbours_pair_as_with_one_endpoint_and_all_cross_over_several() {
        let one = Pairing::neighbours(10, 1).expect("even");
        assert_is_a_pairing(&one, 10);
        assert_eq!((one.partner(0), one.partner(1), one.partner(6)), (1, 0, 7));
        assert_eq!((one.pairs(), one.cross_pairs()), (5, 0));
        for endpoints in 2..6 {
            let spread = Pairing::neighbours(10, endpoints).expect("even");
            assert_eq!(spread.partners, one.partners);
            assert_eq!(spread.cross_pairs(), 5, "consecutive users are on different endpoints");
        }
        assert_eq!(Pairing::neighbours(7, 2), Err(PairingError::OddUsers(7)));
    }

    #[test]
    fn the_cross_share_is_met_and_exceeded_by_as_little_as_possible() {
        for endpoints in 2..=5 {
            for users in (2..=64).step_by(2) {
                for tenth in 0..=10 {
                    let share = f64::from(tenth) / 10.0;
                    let pairing = Pairing::with_cross_share(users, endpoints, share).expect("valid settings");
                    assert_is_a_pairing(&pairing, users);
                    let wanted = wanted_cross_pairs(users / 2, share);
                    let crossed = pairing.cross_pairs();
                    assert!(crossed >= wanted, "{users} users, {endpoints} endpoints, share {share}: {crossed}");
                    // More cross than asked only where the endpoints' sizes force it: a
                    // pair or two to keep what is left balanced, or the odd users out of
                    // the endpoints when nearly every pair stays on one.
                    assert!(
                        crossed <= wanted + 2 || crossed <= endpoints / 2,
                        "{users} users, {endpoints} endpoints, share {share}: {crossed} cross, {wanted} wanted"
                    );
                }
            }
        }
    }

    #[test]
    fn half_of_a_thousand_users_on_three_endpoints_cross_exactly() {
        let pairing = Pairing::with_cross_share(1000, 3, 0.5).expect("valid settings");
        assert_is_a_pairing(&pairing, 1000);
        assert_eq!((pairing.pairs(), pairing.cross_pairs()), (500, 250));
        assert_eq!(Pairing::with_cross_share(1000, 3, 0.5), Ok(pairing), "the same settings give the same pairs");
        assert_eq!(Pairing::with_cross_share(1000, 3, 1.0).expect("valid").cross_pairs(), 500);
        // 334 + 333 + 333 users: the odd users out of two endpoints must pair across.
        assert_eq!(Pairing::with_cross_share(1000, 3, 0.0).expect("valid").cross_pairs(), 1);
        assert_eq!(Pairing::with_cross_share(1002, 3, 0.0).expect("valid").cross_pairs(), 0);
        assert_eq!(Pairing::with_cross_share(1000, 2, 0.3).expect("valid").cross_pairs(), 150);
    }

    #[test]
    fn two_endpoints_keep_their_sides_even() {
        // 4 users on 2 endpoints (2 each), one pair to cross: a same-endpoint pair would
        // leave the other endpoint's two users, so both pairs cross.
        let pairing = Pairing::with_cross_share(4, 2, 0.5).expect("valid settings");
        assert_is_a_pairing(&pairing, 4);
        assert_eq!(pairing.cross_pairs(), 2);
        // 6 users (3 each): a same-endpoint pair on each side, then one across.
        assert_eq!(Pairing::with_cross_share(6, 2, 0.3).expect("valid").cross_pairs(), 1);
        assert_eq!(Pairing::with_cross_share(8, 2, 0.5).expect("valid").cross_pairs(), 2);
    }

    #[test]
    fn impossible_settings_are_refused() {
        assert_eq!(Pairing::with_cross_share(10, 1, 0.5), Err(PairingError::OneEndpoint(0.5)));
        assert_eq!(Pairing::with_cross_share(10, 1, 0.0).map(|p| p.cross_pairs()), Ok(0));
        assert_eq!(Pairing::with_cross_share(10, 3, 1.5), Err(PairingError::Share(1.5)));
        assert!(Pairing::with_cross_share(10, 3, f64::NAN).is_err());
        assert_eq!(Pairing::with_cross_share(9, 3, 0.5), Err(PairingError::OddUsers(9)));
    }

    #[test]
    fn shares_round_up_to_whole_pairs() {
        assert_eq!(wanted_cross_pairs(10, 0.3), 3, "0.3 x 10 is 3.0000000000000004 in floating point");
        assert_eq!(wanted_cross_pairs(10, 0.31), 4);
        assert_eq!(wanted_cross_pairs(500, 0.5), 250);
        assert_eq!(wanted_cross_pairs(7, 1.0), 7);
        assert_eq!(wanted_cross_pairs(7, 0.0), 0);
    }
}

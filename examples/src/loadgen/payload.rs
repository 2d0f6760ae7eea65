//! The body of a load-test message: when it was sent, which of its sender's messages it
//! is, and a checkable filler, so the receiver can measure latency and prove the body
//! arrived intact without any shared table.
//!
//! Layout (little-endian): bytes 0..8 the send time in microseconds since the run's epoch,
//! bytes 8..16 the sender's message counter, then filler where byte `i` is
//! `counter as u8 + i as u8`.

use std::collections::HashSet;

use bytes::Bytes;

/// Smallest body the layout fits in.
pub const MIN_BODY_BYTES: usize = 16;

/// What a load-test body says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Payload {
    /// Send time, microseconds since the run's epoch.
    pub sent_us: u64,
    /// The sender's message counter, from 0.
    pub counter: u64,
}

impl Payload {
    /// Encodes into a body of `len` bytes (at least [`MIN_BODY_BYTES`]).
    pub fn encode(self, len: usize) -> Bytes {
        let len = len.max(MIN_BODY_BYTES);
        let mut body = Vec::with_capacity(len);
        body.extend_from_slice(&self.sent_us.to_le_bytes());
        body.extend_from_slice(&self.counter.to_le_bytes());
        let seed = self.counter as u8;
        body.extend((MIN_BODY_BYTES..len).map(|index| filler(seed, index)));
        Bytes::from(body)
    }

    /// Decodes a body, or `None` if it is not `len` bytes (at least [`MIN_BODY_BYTES`])
    /// with the right filler: it was altered on the way.
    pub fn decode(body: &[u8], len: usize) -> Option<Self> {
        if body.len() != len.max(MIN_BODY_BYTES) {
            return None;
        }
        let sent_us = u64::from_le_bytes(body.get(0..8)?.try_into().ok()?);
        let counter = u64::from_le_bytes(body.get(8..16)?.try_into().ok()?);
        let seed = counter as u8;
        let intact = body.iter().enumerate().skip(MIN_BODY_BYTES).all(|(index, &byte)| byte == filler(seed, index));
        intact.then_some(Self { sent_us, counter })
    }
}

fn filler(seed: u8, index: usize) -> u8 {
    seed.wrapping_add(index as u8)
}

/// Which counters of one sender have arrived, in memory proportional to how far out of
/// order they come rather than to how many there were.
#[derive(Debug, Default)]
pub struct SeenCounters {
    /// Every counter below this has arrived.
    contiguous: u64,
    /// Counters at or above `contiguous` that have arrived.
    ahead: HashSet<u64>,
}

impl SeenCounters {
    /// Records `counter`; `true` if it had not arrived before.
    pub fn insert(&mut self, counter: u64) -> bool {
        if counter < self.contiguous || !self.ahead.insert(counter) {
            return false;
        }
        while self.ahead.remove(&self.contiguous) {
            self.contiguous += 1;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips() {
        for len in [0, 16, 17, 64, 1000] {
            let payload = Payload { sent_us: 123_456_789, counter: 300 };
            let body = payload.encode(len);
            assert_eq!(body.len(), len.max(MIN_BODY_BYTES));
            assert_eq!(Payload::decode(&body, len), Some(payload));
        }
    }

    #[test]
    fn altered_bodies_are_detected() {
        let payload = Payload { sent_us: 1, counter: 2 };
        let body = payload.encode(64);
        assert_eq!(Payload::decode(&body[..63], 64), None);
        let mut flipped = body.to_vec();
        flipped[40] ^= 1;
        assert_eq!(Payload::decode(&flipped, 64), None);
        assert_eq!(Payload::decode(&body, 65), None);
    }

    #[test]
    fn seen_counters_spot_repeats_in_any_order() {
        let mut seen = SeenCounters::default();
        assert!(seen.insert(0));
        assert!(seen.insert(2));
        assert!(!seen.insert(2));
        assert!(seen.insert(1));
        assert!(!seen.insert(0));
        assert!(!seen.insert(1));
        assert!(seen.ahead.is_empty(), "contiguous run folds the set away");
        assert!(seen.insert(3));
    }
}

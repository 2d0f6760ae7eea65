//! The per-conversation ordering buffer: pure logic, no I/O, so it is unit-tested alone.
//!
//! It holds `cursor`, the highest seq such that every message at or below it has been
//! released (emitted, or known to be this device's own send, or known not to exist). Seqs
//! may have gaps (a crashed node skips the rest of its leased seqs), so a missing seq is only
//! skipped once the server says so: a `sync` reply's `complete_through_seq`.

use std::collections::{BTreeMap, BTreeSet};

/// One step forward of the cursor: a message to emit, or (without one) a skipped seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Release<M> {
    pub(crate) seq: u64,
    pub(crate) message: Option<M>,
}

#[derive(Debug)]
pub(crate) struct ConversationOrder<M> {
    /// Everything at or below it is released; `None` until the baseline is known.
    pub(crate) cursor: Option<u64>,
    /// The highest seq known to exist (a later message, a hint, a `latest_seq`).
    pub(crate) target: u64,
    held: BTreeMap<u64, M>,
    /// Seqs of this device's own sends above the cursor: present, but not emitted.
    own: BTreeSet<u64>,
    /// Without a cursor, the first message offered sets the start (direct and group
    /// conversations: the server pushes from its cursor of this device); rooms wait for
    /// `set_baseline` from `subscribed` instead.
    baseline_from_first: bool,
}

impl<M> ConversationOrder<M> {
    pub(crate) fn new(cursor: Option<u64>, baseline_from_first: bool) -> Self {
        Self { cursor, target: cursor.unwrap_or(0), held: BTreeMap::new(), own: BTreeSet::new(), baseline_from_first }
    }

    /// Something is known to exist above the cursor that has not been released yet.
    pub(crate) fn lacking(&self) -> bool {
        self.cursor.is_some_and(|cursor| !self.held.is_empty() || !self.own.is_empty() || self.target > cursor)
    }

    /// Offers a message (`own`: sent by this very device, released without being emitted).
    /// Returns what can be released now, in seq order, or `None` for a duplicate (at or
    /// below the cursor, or already held).
    pub(crate) fn offer(&mut self, seq: u64, message: M, own: bool) -> Option<Vec<Release<M>>> {
        if self.cursor.is_none() && self.baseline_from_first {
            self.cursor = Some(seq.saturating_sub(1));
        }
        if self.cursor.is_some_and(|cursor| seq <= cursor) || self.held.contains_key(&seq) || self.own.contains(&seq) {
            return None;
        }
        if own {
            self.own.insert(seq);
        } else {
            self.held.insert(seq, message);
        }
        self.target = self.target.max(seq);
        Some(self.drain())
    }

    /// This device's own send was stored at `seq`. Ignored while there is no baseline.
    pub(crate) fn mark_own(&mut self, seq: u64) -> Vec<Release<M>> {
        match self.cursor {
            Some(cursor) if seq > cursor && !self.held.contains_key(&seq) => {
                self.own.insert(seq);
                self.target = self.target.max(seq);
                self.drain()
            }
            _ => Vec::new(),
        }
    }

    /// Sets the starting point where none is known (a room's `latest_seq`, a sync reply).
    pub(crate) fn set_baseline(&mut self, seq: u64) -> Vec<Release<M>> {
        if self.cursor.is_some() {
            return Vec::new();
        }
        // A message pushed before the baseline arrived is kept, not dropped: start below it.
        let lowest = self.held.keys().next().map_or(seq, |first| seq.min(first.saturating_sub(1)));
        self.cursor = Some(lowest);
        self.target = self.target.max(seq);
        self.drain()
    }

    /// The highest seq is at least `seq` (a `sync_hint`, a `latest_seq`).
    pub(crate) fn raise_target(&mut self, seq: u64) {
        self.target = self.target.max(seq);
    }

    /// The server says every message with a seq up to `through` has been returned (and
    /// offered) or does not exist: release what is held up to it, skip the rest.
    pub(crate) fn complete_through(&mut self, through: u64) -> Vec<Release<M>> {
        let Some(cursor) = self.cursor else {
            return self.set_baseline(through);
        };
        let mut out = Vec::new();
        if through > cursor {
            let mut seqs: Vec<u64> = self.held.range(..=through).map(|(seq, _)| *seq).collect();
            seqs.extend(self.own.range(..=through).copied());
            seqs.sort_unstable();
            for seq in &seqs {
                let message = self.held.remove(seq);
                self.own.remove(seq);
                out.push(Release { seq: *seq, message });
            }
            if seqs.last().is_none_or(|last| *last < through) {
                out.push(Release { seq: through, message: None });
            }
            self.cursor = Some(through);
        }
        out.extend(self.drain());
        out
    }

    /// Gives up on what is missing (the conversation cannot be read): releases all it holds.
    pub(crate) fn release_all(&mut self) -> Vec<Release<M>> {
        let top = [self.target, self.held.keys().last().copied().unwrap_or(0), self.own.last().copied().unwrap_or(0)]
            .into_iter()
            .max()
            .unwrap_or(0);
        self.complete_through(top)
    }

    fn drain(&mut self) -> Vec<Release<M>> {
        let mut out = Vec::new();
        let Some(mut cursor) = self.cursor else {
            return out;
        };
        loop {
            let next = cursor + 1;
            if let Some(message) = self.held.remove(&next) {
                out.push(Release { seq: next, message: Some(message) });
            } else if self.own.remove(&next) {
                out.push(Release { seq: next, message: None });
            } else {
                break;
            }
            cursor = next;
        }
        self.cursor = Some(cursor);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqs(released: &[Release<&'static str>]) -> Vec<(u64, Option<&'static str>)> {
        released.iter().map(|step| (step.seq, step.message)).collect()
    }

    #[test]
    fn releases_in_order_and_holds_on_a_gap() {
        let mut order = ConversationOrder::new(Some(0), true);
        assert_eq!(seqs(&order.offer(2, "b", false).unwrap_or_default()), []);
        assert!(order.lacking());
        assert_eq!(seqs(&order.offer(1, "a", false).unwrap_or_default()), [(1, Some("a")), (2, Some("b"))]);
        assert!(order.offer(2, "b", false).is_none(), "a duplicate");
        assert!(!order.lacking());
    }

    #[test]
    fn complete_through_skips_missing_seqs_and_own_sends_move_the_cursor() {
        let mut order = ConversationOrder::new(Some(3), true);
        order.offer(6, "f", false);
        assert_eq!(seqs(&order.mark_own(4)), [(4, None)]);
        assert_eq!(seqs(&order.complete_through(6)), [(6, Some("f"))]);
        assert_eq!(order.cursor, Some(6));
        assert_eq!(seqs(&order.complete_through(8)), [(8, None)]);
    }

    #[test]
    fn rooms_wait_for_their_start_and_keep_an_early_push() {
        let mut order = ConversationOrder::new(None, false);
        assert_eq!(seqs(&order.offer(11, "k", false).unwrap_or_default()), []);
        assert_eq!(seqs(&order.set_baseline(11)), [(11, Some("k"))]);
        let mut fresh = ConversationOrder::<&str>::new(None, true);
        assert_eq!(seqs(&fresh.offer(5, "e", false).unwrap_or_default()), [(5, Some("e"))]);
    }

    #[test]
    fn giving_up_releases_everything_held() {
        let mut order = ConversationOrder::new(Some(0), true);
        order.offer(3, "c", false);
        order.raise_target(5);
        assert_eq!(seqs(&order.release_all()), [(3, Some("c")), (5, None)]);
        assert!(!order.lacking());
    }
}

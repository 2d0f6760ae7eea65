//! The node's own account of its lease: until when it may act as the holder, measured on
//! this node's monotonic clock from when it *sent* its last successful renew.
//!
//! Redis set the lease's expiry to its own "now" plus the TTL when it ran that renew, which
//! was after the node sent it; so `sent + ttl` is never later than the expiry Redis keeps,
//! and `sent + ttl − margin` leaves `margin` for the two clocks' rates to differ and for the
//! node to stop what it is doing. The module doc of [`super`] has the whole argument.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Until when this node may act as the holder of its lease.
#[derive(Debug)]
pub(super) struct LeaseClock {
    /// What `valid_until` counts from (when the join was sent).
    origin: Instant,
    /// Nanoseconds after `origin` from which the lease may have lapsed; 0 once the lease is
    /// lost or given up, which is for good.
    valid_until: AtomicU64,
    /// How long a successful renew keeps the lease valid: the TTL minus the margin.
    validity: Duration,
}

impl LeaseClock {
    /// A lease taken by a request sent at `sent`, valid `validity` from each renew sent.
    pub(super) fn new(sent: Instant, validity: Duration) -> Self {
        let clock = Self { origin: sent, valid_until: AtomicU64::new(0), validity };
        clock.valid_until.store(clock.offset(sent + validity).max(1), Ordering::SeqCst);
        clock
    }

    /// Whether the lease is certainly still this node's at this instant.
    pub(super) fn holds(&self) -> bool {
        self.valid_until().is_some_and(|until| Instant::now() < until)
    }

    /// From when the lease may have lapsed; `None` once lost or given up.
    pub(super) fn valid_until(&self) -> Option<Instant> {
        match self.valid_until.load(Ordering::SeqCst) {
            0 => None,
            nanos => Some(self.origin + Duration::from_nanos(nanos)),
        }
    }

    /// A renew sent at `sent` succeeded: the lease is valid until `sent + validity`, unless
    /// a later renew already said more, or the lease was given up.
    pub(super) fn renewed(&self, sent: Instant) {
        let until = self.offset(sent + self.validity).max(1);
        let _ = self.valid_until.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |current| {
            (current != 0 && current < until).then_some(until)
        });
    }

    /// The lease is lost or given up: it is never held again.
    pub(super) fn give_up(&self) {
        self.valid_until.store(0, Ordering::SeqCst);
    }

    fn offset(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALIDITY: Duration = Duration::from_millis(480);

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_held_until_the_validity_after_the_last_renew_sent() {
        let clock = LeaseClock::new(Instant::now(), VALIDITY);
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(clock.holds());
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(100)).await;
        clock.renewed(sent);
        assert_eq!(clock.valid_until(), Some(sent + VALIDITY), "counted from when the renew was sent");
        tokio::time::advance(Duration::from_millis(379)).await;
        assert!(clock.holds());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!clock.holds(), "lapsed at sent + validity exactly");
        let late = Instant::now();
        clock.renewed(late);
        assert!(clock.holds(), "a renew that succeeded is a lease held again");
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_renew_answering_late_never_shortens_the_lease() {
        let clock = LeaseClock::new(Instant::now(), VALIDITY);
        let older = Instant::now();
        tokio::time::advance(Duration::from_millis(150)).await;
        let newer = Instant::now();
        clock.renewed(newer);
        clock.renewed(older);
        assert_eq!(clock.valid_until(), Some(newer + VALIDITY));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_given_up_is_never_held_again() {
        let clock = LeaseClock::new(Instant::now(), VALIDITY);
        clock.give_up();
        clock.renewed(Instant::now());
        assert!(!clock.holds());
        assert_eq!(clock.valid_until(), None);
    }
}

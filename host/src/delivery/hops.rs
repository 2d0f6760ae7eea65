//! Hops asked again: a `deliver` or a room publish another node was not asked — its link
//! broke, or could not be opened, its breaker is open — is asked again in the background,
//! so a device that stays connected to that node still gets the message live. Without it,
//! the device would get the message only at its next sync or reconnect, and a live
//! connection makes neither; a room subscriber would have to notice the gap and catch up.
//!
//! A hop is not asked again when the first ask may have been carried out
//! ([`BusError::may_have_landed`]), as each kind allows:
//! - A `deliver` that went out and was not answered in time is not: the node most likely
//!   pushed it late, and it is late because it is overloaded (or paused), which a second
//!   copy of every late hop would only make worse. In three-node runs flat out on a 2-core
//!   box, hundreds to thousands of hops a run timed out so; each would have been sent twice.
//!   One whose link broke after it went out is: a session takes each seq once and skips one
//!   its device acked, so a second copy is harmless.
//! - A room publish is asked again only if it certainly never went out: room messages are
//!   pushed once, never again (PROTOCOL.md), and a subscriber's session keeps no seqs to
//!   skip a second copy by.
//!
//! The first wait is [`FIRST_WAIT`], doubling (with jitter) up to [`LONGEST_WAIT`], for at
//! most `delivery.hop_retry_for_ms` in all, and only while that node is still a member: a
//! node whose lease lapsed has lost its devices, which reconnect elsewhere and backfill. At
//! most `delivery.hop_retry_max_pending` hops wait at once; past it a failed hop is left to
//! its devices' next sync.
//!
//! The retries run in their own task: fan-out, which releases a conversation's messages in
//! seq order, never waits for them.
//!
//! Counter: `herald_delivery_hop_retries_total{outcome}` — `delivered` (a retry got
//! through), `given_up` (the time ran out, the node left, or a retry may have landed),
//! `overflow` (too many waiting), `late` (not asked again: the first ask may have been
//! carried out).

use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Delivery;
use crate::model::{Message, NodeId, UserId};
use crate::routing::bus::{Addressed, BusError};
use crate::telemetry::Throttle;

/// The wait before the first retry.
pub const FIRST_WAIT: Duration = Duration::from_millis(100);
/// The longest wait between two retries.
pub const LONGEST_WAIT: Duration = Duration::from_secs(2);

/// A hop that failed: the node asked, the message, and what it was asked to do with it.
pub(super) struct Hop {
    pub node: NodeId,
    pub message: Arc<Message>,
    pub ask: Ask,
}

/// What a node was asked to do with a message.
pub(super) enum Ask {
    /// Push it to these users' devices there.
    Deliver { users: Vec<UserId>, addressed: Addressed },
    /// Push it to its room's subscribers there.
    Room,
}

impl Ask {
    /// Whether a hop that failed with `error` may be asked again (the module docs say why).
    fn again_after(&self, error: &BusError) -> bool {
        match self {
            Self::Deliver { .. } => !matches!(error, BusError::Late { .. }),
            Self::Room => !error.may_have_landed(),
        }
    }
}

/// The failed hops waiting to be asked again: a permit each, at most
/// `delivery.hop_retry_max_pending`.
pub(super) struct HopRetries {
    places: Arc<Semaphore>,
    max_waiting: usize,
    retry_for: Duration,
}

impl HopRetries {
    pub fn new(retry_for: Duration, max_waiting: usize) -> Self {
        let max_waiting = max_waiting.min(Semaphore::MAX_PERMITS);
        Self { places: Arc::new(Semaphore::new(max_waiting)), max_waiting, retry_for }
    }

    /// Hops waiting now.
    pub fn waiting(&self) -> usize {
        self.max_waiting - self.places.available_permits()
    }

    /// A place for one more hop, given back when dropped; none when retries are off or
    /// every place is taken.
    fn place(&self) -> Option<OwnedSemaphorePermit> {
        if self.retry_for.is_zero() {
            return None;
        }
        Arc::clone(&self.places).try_acquire_owned().ok()
    }
}

impl Delivery {
    /// Asks `hop`'s node again, in the background, until it answers, the time runs out or
    /// the node leaves the cluster — unless `error` says the first ask may have landed.
    pub(super) fn retry_hop(self: &Arc<Self>, hop: Hop, error: &BusError) {
        if !hop.ask.again_after(error) {
            metrics::counter!("herald_delivery_hop_retries_total", "outcome" => "late").increment(1);
            return;
        }
        let Some(place) = self.hops.place() else {
            if !self.hops.retry_for.is_zero() {
                metrics::counter!("herald_delivery_hop_retries_total", "outcome" => "overflow").increment(1);
            }
            return;
        };
        let delivery = Arc::clone(self);
        let schedule = ExponentialBuilder::new()
            .with_min_delay(FIRST_WAIT)
            .with_max_delay(LONGEST_WAIT)
            .with_jitter()
            .without_max_times()
            .with_total_delay(Some(self.hops.retry_for.saturating_sub(FIRST_WAIT)));
        tokio::spawn(async move {
            let _place = place;
            tokio::time::sleep(FIRST_WAIT).await;
            let bus = &delivery.reach.bus;
            let still_member = || bus.peers().contains(&hop.node);
            let hop = &hop;
            let ask = || async move {
                let message = Arc::clone(&hop.message);
                match &hop.ask {
                    Ask::Deliver { users, addressed } => bus.deliver(hop.node, message, users, *addressed).await,
                    Ask::Room => bus
                        .publish_room(&[hop.node], message)
                        .await
                        .map_err(|mut failed| failed.pop().unwrap_or(BusError::Unreachable(hop.node))),
                }
            };
            let outcome = if still_member() {
                let worth_asking = |error: &BusError| hop.ask.again_after(error) && still_member();
                ask.retry(schedule).sleep(tokio::time::sleep).when(worth_asking).await
            } else {
                Err(BusError::Unreachable(hop.node))
            };
            let outcome = match outcome {
                Ok(()) => "delivered",
                Err(error) => {
                    static GIVEN_UP: Throttle = Throttle::new();
                    if let Some(suppressed) = GIVEN_UP.allow() {
                        tracing::warn!(%error, suppressed, "a node holding recipients was not reached in time; they sync");
                    }
                    "given_up"
                }
            };
            metrics::counter!("herald_delivery_hop_retries_total", "outcome" => outcome).increment(1);
        });
    }
}

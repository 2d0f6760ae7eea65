//! The downlink: pushing stored messages to devices, acks and retries, backfill on connect,
//! and pull (`sync`, `history`, room catch-up).
//!
//! Push when online, pull when not (ARCHITECTURE.md §3). A pushed message not acked is
//! pushed again after the ack timeout, the wait doubling each time (capped, with jitter), up
//! to `max_attempts`; then it waits for the device to pull. Rooms get no retries.

pub mod cursors;
pub mod pull;

use std::sync::Arc;
use std::time::Duration;

use herald_proto::v1::{self, Frame};
use tokio::sync::Semaphore;

use crate::config::DeliveryConfig;
use crate::gateway::connection::{Connection, Connections};
use crate::health::Vitals;
use crate::model::{ConversationId, ConversationKind, UserId};
use crate::pipeline::lanes::Lanes;
use crate::pipeline::membership::Membership;
use crate::routing::RouteTable;
use crate::routing::rooms::Rooms;
use crate::store::{Database, StoredMessage};

use cursors::CursorBuffer;

/// Everything the downlink needs.
pub struct Delivery {
    pub config: DeliveryConfig,
    /// This node, to tell local routes from remote ones.
    pub node_id: u32,
    pub connections: Arc<Connections>,
    pub routes: Arc<dyn RouteTable>,
    pub rooms: Arc<Rooms>,
    pub membership: Arc<Membership>,
    pub database: Database,
    pub lanes: Arc<Lanes>,
    pub cursors: CursorBuffer,
    /// Bounds how many devices are backfilled at once.
    pub backfill_permits: Semaphore,
    /// Push and redelivery counts, and the tier in force (set from the degrade hook).
    pub vitals: Arc<Vitals>,
}

/// The wire form of a stored message.
pub fn wire_message(message: &StoredMessage) -> v1::Message {
    v1::Message {
        id: message.id,
        conversation: message.conversation.clone(),
        seq: message.seq,
        sender: message.sender.clone(),
        sender_device: message.sender_device.clone(),
        kind: message.kind,
        body: bytes::Bytes::from(message.body.clone()),
        sent_at_ms: message.sent_at_ms,
    }
}

fn deliver(message: v1::Message, attempt: u32) -> Frame {
    Frame::new(0, v1::Deliver { message: Some(message), attempt })
}

/// "There is more, pull it": what pull-only delivery sends instead of the message.
fn sync_hint(message: &StoredMessage) -> Frame {
    Frame::new(0, v1::SyncHint { conversation: message.conversation.clone(), latest_seq: message.seq })
}

impl Delivery {
    /// Pushes a just-stored message to every online device that should have it: every
    /// device of every member but the one that sent it (room: every subscriber). In the
    /// pull-only tier they get a `sync_hint` instead, and pull.
    pub async fn fan_out(self: &Arc<Self>, message: Arc<StoredMessage>) {
        let Ok(conversation) = ConversationId::parse(&message.conversation) else { return };
        // Pull-only: no message is built, only hints go out.
        let wire = self.vitals.tier().pushes().then(|| wire_message(&message));
        let members: Vec<UserId> = match conversation.kind() {
            ConversationKind::Room(_) => {
                for id in self.rooms.subscribers(&conversation) {
                    if let Some(connection) = self.connections.get(id)
                        && !is_own(&connection, &message)
                    {
                        connection.push(match &wire {
                            Some(wire) => deliver(wire.clone(), 1),
                            None => sync_hint(&message),
                        });
                    }
                }
                return;
            }
            ConversationKind::Direct(a, b) => vec![a, b],
            ConversationKind::Group(group) => match self.membership.group_members(&group).await {
                Ok(Some(members)) => members.as_ref().clone(),
                Ok(None) => return,
                Err(error) => {
                    // The message is stored; members pull it when they next sync.
                    tracing::warn!(%error, "group members unavailable for fan-out");
                    return;
                }
            },
        };
        for user in members {
            let routes = match self.routes.devices(&user).await {
                Ok(routes) => routes,
                Err(error) => {
                    tracing::warn!(%error, "route table unavailable for fan-out");
                    continue;
                }
            };
            // Connected here, and dropped here within the grace period (they note it as
            // owed, for their device's return).
            let connected = routes
                .into_iter()
                .filter(|route| route.node == self.node_id)
                .filter_map(|route| self.connections.get(route.connection));
            for connection in connected.chain(self.connections.parked_of(&user)) {
                if is_own(&connection, &message) {
                    continue;
                }
                match &wire {
                    None if connection.is_live() => _ = connection.push(sync_hint(&message)),
                    None => {}
                    Some(wire) => {
                        if let Some(connection) = connection.offer(&conversation, message.seq) {
                            self.push_tracked(&connection, &conversation, wire.clone(), 1);
                        }
                    }
                }
            }
        }
        metrics::counter!("herald_delivery_fanouts_total").increment(1);
    }

    /// Pushes `message` and arranges for it to be pushed again until acked.
    fn push_tracked(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        conversation: &ConversationId,
        message: v1::Message,
        attempt: u32,
    ) {
        if connection.push(deliver(message.clone(), attempt)) {
            self.vitals.count_push(attempt);
            self.schedule_retry(Arc::clone(connection), conversation.clone(), message, attempt);
        }
    }

    /// Pushes `message` again after the backoff for `attempt` unless acked by then, the
    /// attempts are used up, or the tier sheds retries (the device then syncs).
    fn schedule_retry(
        self: &Arc<Self>,
        connection: Arc<Connection>,
        conversation: ConversationId,
        message: v1::Message,
        attempt: u32,
    ) {
        if attempt >= self.config.max_attempts {
            return;
        }
        let delivery = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(backoff(&delivery.config, attempt)).await;
            if connection.is_closed()
                || connection.acked_through(&conversation) >= message.seq
                || !delivery.vitals.tier().retries()
            {
                return;
            }
            metrics::counter!("herald_delivery_redeliveries_total").increment(1);
            delivery.push_tracked(&connection, &conversation, message, attempt + 1);
        });
    }

    /// A cumulative ack from a device: stops retries up to `seq` and moves its cursor.
    pub async fn ack(&self, connection: &Connection, conversation: &ConversationId, seq: u64) {
        if self.membership.check_read(&connection.user, conversation).await.is_err() {
            return; // not theirs: nothing to record
        }
        if connection.record_ack(conversation, seq) {
            self.cursors.record(&connection.user, &connection.device, conversation, seq);
        }
    }

    /// Writes coalesced cursors every flush interval, for ever.
    pub async fn flush_cursors_periodically(self: Arc<Self>) {
        let mut every = tokio::time::interval(Duration::from_millis(self.config.cursor_flush_ms));
        loop {
            every.tick().await;
            self.cursors.flush(&self.database).await;
        }
    }
}

/// Whether `connection` is the very device that sent `message` (it has it already).
fn is_own(connection: &Connection, message: &StoredMessage) -> bool {
    connection.user.as_str() == message.sender && connection.device.as_str() == message.sender_device
}

/// The wait after push number `attempt`: ack timeout × 2^(attempt-1), capped at the
/// backoff maximum, plus a random 0..jitter share of itself.
pub fn backoff(config: &DeliveryConfig, attempt: u32) -> Duration {
    let base = config.ack_timeout_ms.saturating_mul(1u64 << attempt.saturating_sub(1).min(20));
    let capped = base.min(config.backoff_max_ms.max(config.ack_timeout_ms));
    let jitter = rand::random::<f64>() * config.jitter;
    Duration::from_millis(capped + (capped as f64 * jitter) as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn backoff_doubles_caps_and_jitters_within_bounds() {
        let config = crate::config::DeliveryConfig {
            ack_timeout_ms: 2000,
            backoff_max_ms: 60_000,
            jitter: 0.3,
            ..Default::default()
        };
        let base = [2000u64, 4000, 8000, 16_000, 32_000, 60_000, 60_000];
        for (attempt, expected) in (1..).zip(base) {
            for _ in 0..50 {
                let wait = super::backoff(&config, attempt).as_millis() as u64;
                assert!((expected..=expected * 13 / 10).contains(&wait), "attempt {attempt}: {wait} ms");
            }
        }
    }
}

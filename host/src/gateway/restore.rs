//! A restarted node takes its devices back: the ledgers it saved before it stopped
//! ([`LedgerKeeper`](crate::delivery::ledgers::LedgerKeeper)) become parked sessions, as if
//! each device had just dropped, so that a device back within `gateway.reconnect_grace_ms`
//! resumes from its ledger instead of being backfilled in full.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Gateway, count_connections};
use crate::delivery::ledgers::Saved;
use crate::delivery::session::Session;
use crate::model::ConnectionId;

impl Gateway {
    /// Parks a session for each of `saved` for the reconnect grace; returns how many (none
    /// when the grace is 0).
    pub fn restore(self: &Arc<Self>, saved: Vec<Saved>) -> usize {
        let grace = self.config.reconnect_grace_ms;
        if grace == 0 || saved.is_empty() {
            return 0;
        }
        let sessions = self.delivery.sessions();
        let mut restored = Vec::with_capacity(saved.len());
        for Saved { user, device, ledger } in saved {
            let id = ConnectionId(self.next_connection.fetch_add(1, Ordering::Relaxed));
            let session = Arc::new(Session::restored(id, user, device, ledger));
            sessions.park(Arc::clone(&session));
            restored.push(session);
        }
        let count = restored.len();
        metrics::counter!("herald_gateway_restored_total").increment(count as u64);
        count_connections(self);
        let gateway = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(grace)).await;
            let sessions = gateway.delivery.sessions();
            let expired = restored.iter().filter(|session| sessions.expire(session)).count();
            tracing::info!(expired, "restored sessions whose devices did not come back are forgotten");
            count_connections(&gateway);
        });
        count
    }

    /// From now on a connection closed by the drain is parked rather than forgotten, so
    /// that its ledger is saved at shutdown (the node saves its devices' ledgers).
    pub fn park_at_drain(&self) {
        self.park_at_drain.store(true, Ordering::SeqCst);
    }
}

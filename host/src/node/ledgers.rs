//! Taking devices back after a restart (`cluster.placement` set): the node saves its
//! devices' ledgers in Redis while it runs and at shutdown, and on start parks the ledgers
//! of the devices whose home it is, so that nginx's sending them back resumes them
//! (OPERATIONS.md, "Placement").

use std::sync::Arc;
use std::time::Duration;

use super::cluster::Cluster;
use crate::clock::WallClock;
use crate::config::Placement;
use crate::delivery::ledgers::LedgerKeeper;
use crate::delivery::sessions::Sessions;
use crate::gateway::Gateway;
use crate::routing::router::Router;

/// How often a running node saves the ledgers that changed.
pub(super) const SAVE_EVERY: Duration = Duration::from_secs(1);

/// With placement and a client address, the keeper of this node's ledgers, having parked
/// the ones saved before this start whose device's home this node is. Runs before the node
/// accepts a connection, so a device back at once finds its ledger.
pub(super) async fn take_back(
    cluster: &Cluster,
    placement: Placement,
    restore: bool,
    gateway: &Arc<Gateway>,
    sessions: Arc<Sessions>,
    clock: Arc<dyn WallClock>,
    router: &Router,
) -> Option<Arc<LedgerKeeper>> {
    if placement == Placement::None || !restore {
        return None;
    }
    let store = cluster.ledger_store()?;
    let client = store.client().to_owned();
    let keeper = Arc::new(LedgerKeeper::new(Arc::new(store), sessions, clock));
    // By address, not node id: after a kill -9 this node may have a new id while the old
    // one's lease, at the same address, has not lapsed yet.
    let view = router.topology().view();
    match keeper.load(|user| view.homes.home_address(user.as_str()) == Some(client.as_str())).await {
        Ok(saved) => {
            let restored = gateway.restore(saved);
            tracing::info!(restored, "devices' ledgers restored from before this start");
        }
        Err(error) => {
            tracing::warn!(%error, "cannot read the ledgers saved before this start; devices backfill in full")
        }
    }
    gateway.park_at_drain();
    Some(keeper)
}

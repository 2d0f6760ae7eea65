//! Who is connected where: the route table (user → device → node and connection) and the
//! room subscriptions of this node.
//!
//! Each part cluster mode replaces is a trait with this process's implementation beside it,
//! chosen once where the node is assembled (`node.rs`): the route table (log a device in and
//! learn which connection it replaces; every device of many users in one lookup), the room
//! directory, the ring in force ([`topology`]) and the node bus ([`bus`]).

pub mod bus;
pub mod cache;
pub mod placement;
pub mod ring;
pub mod rooms;
pub mod router;
pub mod topology;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::maps::{DashMap, HashMap, Keyed};
use crate::model::{ConnectionId, DeviceId, NodeId, UserId};

/// Where one device of a user is connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub user: UserId,
    pub device: DeviceId,
    /// The gateway node holding the connection.
    pub node: NodeId,
    /// The connection on that node.
    pub connection: ConnectionId,
    /// When it connected, ms since the Unix epoch.
    pub connected_at_ms: u64,
    /// The connection dropped and its session is parked on `node` for the reconnect grace:
    /// fan-out still reaches the node, which notes what the device is owed for its return,
    /// but the device is not online (presence leaves it out).
    pub parked: bool,
}

/// A route table could not be read or written (cluster mode: Redis is down). The cause
/// (Redis's own error, naming the step that failed) is its source, to ask what failed,
/// and shared, so every lookup joined to one read fails with the same one. As in the
/// cluster's Redis failures, the message repeats the cause: a log line of `%error` says
/// all.
#[derive(Debug, Clone, thiserror::Error)]
#[error("route table unavailable: {0}")]
pub struct RouteError(#[source] Arc<dyn std::error::Error + Send + Sync>);

impl RouteError {
    /// A failure caused by `cause` (an error, or a message where there is none).
    pub fn new(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(Arc::from(cause.into()))
    }

    /// The cause, to ask what failed (`downcast_ref`).
    pub fn cause(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

/// Where connected devices are. Embedded: a map in this process. Cluster: shared by every
/// node.
#[async_trait]
pub trait RouteTable: Send + Sync + 'static {
    /// Records `route`; returns the route it replaced (the same user and device on another
    /// connection), which the caller kicks.
    async fn login(&self, route: Route) -> Result<Option<Route>, RouteError>;
    /// Removes the route of `user`'s `device` if it is still `connection` on `node`.
    async fn logout(
        &self,
        user: &UserId,
        device: &DeviceId,
        node: NodeId,
        connection: ConnectionId,
    ) -> Result<bool, RouteError>;
    /// `user`'s `device` dropped its connection, whose session `node` parks for the device's
    /// return: its route stays, [`parked`](Route::parked), if it still names `connection`
    /// on `node`, so that every node's fan-out keeps reaching the parked session and its
    /// device, back within the grace, is owed what was sent meanwhile. Returns whether the
    /// route was still there. The node removes it ([`logout`](Self::logout)) when the grace
    /// is over. By default a plain logout: a table whose every session is in this process
    /// needs no route to find a parked one.
    async fn park(
        &self,
        user: &UserId,
        device: &DeviceId,
        node: NodeId,
        connection: ConnectionId,
    ) -> Result<bool, RouteError> {
        self.logout(user, device, node, connection).await
    }
    /// Every connected device of each of `users`, in one lookup (a group's fan-out asks for
    /// all its members at once). A user with no device is absent from the map.
    async fn devices_of(&self, users: &[UserId]) -> Result<HashMap<UserId, Vec<Route>>, RouteError>;
    /// Writes `route` again unless its device has a route already (a newer connection wrote
    /// it meanwhile); returns whether it wrote. For a node re-asserting its connections'
    /// routes after the shared table lost its data.
    async fn restore(&self, route: Route) -> Result<bool, RouteError>;
    /// A delivery found `route` stale (it names a connection of the delivering node that is
    /// gone): removes it if it still names that connection, and drops cached copies of its
    /// user's routes wherever routes are cached. Returns whether it removed it.
    async fn forget_stale(&self, route: &Route) -> Result<bool, RouteError> {
        self.logout(&route.user, &route.device, route.node, route.connection).await
    }
    /// How many entries this process holds (users with a route, or cached users); a table
    /// kept elsewhere (Redis) holds none here.
    fn held_here(&self) -> usize {
        0
    }
    /// Gives back the room this process's maps grew to for a crowd that has left.
    fn shrink_if_sparse(&self) {}
    /// When `user`'s last device left (ms since the epoch), kept [`LAST_SEEN_KEPT`]; `None`
    /// when no device left since.
    async fn last_left(&self, user: &UserId) -> Result<Option<u64>, RouteError>;
}

/// How long the time a user's last device left is kept, for presence's `last_seen_ms`.
pub const LAST_SEEN_KEPT: Duration = Duration::from_secs(24 * 3600);

/// Now, in ms since the epoch.
pub(crate) fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// The embedded route table: a concurrent map in this process.
pub struct MemoryRouteTable {
    users: DashMap<UserId, HashMap<DeviceId, Route>>,
    /// When each user's last device left, for [`LAST_SEEN_KEPT`] (at most
    /// [`LAST_LEFT_USERS`] users).
    last_left: moka::sync::Cache<UserId, u64, Keyed>,
}

/// The most users whose last departure the embedded table keeps.
const LAST_LEFT_USERS: u64 = 1_000_000;

impl Default for MemoryRouteTable {
    fn default() -> Self {
        let last_left = moka::sync::Cache::builder()
            .time_to_live(LAST_SEEN_KEPT)
            .max_capacity(LAST_LEFT_USERS)
            .build_with_hasher(Keyed::default());
        Self { users: DashMap::default(), last_left }
    }
}

#[async_trait]
impl RouteTable for MemoryRouteTable {
    async fn login(&self, route: Route) -> Result<Option<Route>, RouteError> {
        let mut devices = self.users.entry(route.user.clone()).or_default();
        Ok(devices.insert(route.device.clone(), route))
    }

    async fn logout(
        &self,
        user: &UserId,
        device: &DeviceId,
        node: NodeId,
        connection: ConnectionId,
    ) -> Result<bool, RouteError> {
        let Some(mut devices) = self.users.get_mut(user) else { return Ok(false) };
        let removed = match devices.get(device) {
            Some(route) if route.node == node && route.connection == connection => devices.remove(device).is_some(),
            _ => false,
        };
        let now_empty = devices.is_empty();
        drop(devices);
        if now_empty {
            self.users.remove_if(user, |_, devices| devices.is_empty());
        }
        if removed && now_empty {
            self.last_left.insert(user.clone(), now_ms());
        }
        Ok(removed)
    }

    async fn devices_of(&self, users: &[UserId]) -> Result<HashMap<UserId, Vec<Route>>, RouteError> {
        Ok(users
            .iter()
            .filter_map(|user| {
                let devices = self.users.get(user)?;
                Some((user.clone(), devices.values().cloned().collect()))
            })
            .collect())
    }

    async fn restore(&self, route: Route) -> Result<bool, RouteError> {
        let mut devices = self.users.entry(route.user.clone()).or_default();
        if devices.contains_key(&route.device) {
            return Ok(false);
        }
        devices.insert(route.device.clone(), route);
        Ok(true)
    }

    fn held_here(&self) -> usize {
        self.users.len()
    }

    fn shrink_if_sparse(&self) {
        crate::maps::shrink_if_sparse(&self.users);
    }

    async fn last_left(&self, user: &UserId) -> Result<Option<u64>, RouteError> {
        Ok(self.last_left.get(user))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A route for tests of the routing seams.
    pub(crate) fn route(user: &str, device: &str, node: u32, connection: u64) -> Route {
        Route {
            user: UserId::parse(user).expect("valid"),
            device: DeviceId::parse(device).expect("valid"),
            node: NodeId(node),
            connection: ConnectionId(connection),
            connected_at_ms: 0,
            parked: false,
        }
    }

    #[tokio::test]
    async fn login_replaces_the_same_device_and_logout_needs_the_current_connection() {
        let table = MemoryRouteTable::default();
        assert_eq!(table.login(route("ann", "phone", 0, 1)).await.expect("login"), None);
        assert_eq!(table.login(route("ann", "laptop", 0, 2)).await.expect("login"), None);
        let replaced = table.login(route("ann", "phone", 0, 3)).await.expect("login");
        assert_eq!(replaced.map(|r| r.connection), Some(ConnectionId(1)));
        let ann = UserId::parse("ann").expect("valid");
        let bob = UserId::parse("bob").expect("valid");
        let phone = DeviceId::parse("phone").expect("valid");
        let (zero, three) = (NodeId(0), ConnectionId(3));
        assert!(!table.logout(&ann, &phone, zero, ConnectionId(1)).await.expect("logout"), "a stale connection");
        assert!(!table.logout(&ann, &phone, NodeId(1), three).await.expect("logout"), "the same id on another node");
        table.login(route("bob", "phone", 1, 1)).await.expect("login");
        let both = table.devices_of(&[ann.clone(), bob.clone()]).await.expect("devices");
        assert_eq!((both[&ann].len(), both[&bob].len()), (2, 1), "every device of every user in one lookup");
        assert!(table.logout(&ann, &phone, zero, three).await.expect("logout"));
        assert!(table.logout(&bob, &phone, NodeId(1), ConnectionId(1)).await.expect("logout"));
        let left = table.devices_of(&[ann.clone(), bob.clone()]).await.expect("devices");
        assert_eq!(left.keys().collect::<Vec<_>>(), vec![&ann], "a user with no device is absent");
    }
}

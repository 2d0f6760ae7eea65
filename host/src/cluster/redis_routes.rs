//! The route table in Redis: which node and connection hold each device, seen alike by
//! every node.
//!
//! Keys (module doc of [`crate::cluster`]): `route:{u:<user>}` is a hash of device →
//! `<node>|<connection>|<connected_at_ms>`, so every device of a user is one `HGETALL`;
//! `route:gw:{n:<node>}` is the set of `<user>|<device>|<connection>` a node wrote, so the
//! routes of a dead node can be found without scanning every user.
//!
//! Invariants:
//! - **Login is atomic on the user's hash** (one Lua script, one key): it writes the route
//!   and returns the field it replaced, so exactly one login sees the old connection and
//!   kicks it, however many nodes race.
//! - **A route is only ever removed by its own connection**: logout and [`drop_node`]
//!   delete a field only while it still names that node and connection (compare-and-delete
//!   in Lua), so a slow logout never removes the route of the connection that replaced it.
//! - **No route without its node's set entry.** The set lives in another slot (its tag is
//!   the node), so it cannot be in the login script without `CROSSSLOT` on Redis Cluster.
//!   It is written *before* the script: a crash between the two leaves a set entry whose
//!   route does not exist, which [`drop_node`] skips; the other order could leave a route no
//!   clean-up would ever find.
//!
//! No `route:conn` or `presence` keys with a TTL (seed `002_…`): a half-open connection is
//! closed by the gateway's heartbeat (its logout removes the route), a dead node's routes
//! are removed by the survivors through its `route:gw` set once its lease lapsed, and a
//! route left behind all the same is removed by the first delivery that finds it
//! ([`RouteTable::forget_stale`]); docs/ARCHITECTURE.md §5 says why. The local cache in
//! front of this table is [`CachedRoutes`](crate::routing::cache::CachedRoutes).
//!
//! [`drop_node`]: RedisRouteTable::drop_node

use std::sync::LazyLock;

use async_trait::async_trait;
use futures_util::future::try_join_all;
use redis::Script;

use super::connection::RedisConnection;
use super::{KeyPrefix, RedisTimeouts};
use crate::maps::HashMap;
use crate::model::{ConnectionId, DeviceId, NodeId, UserId};
use crate::routing::{Route, RouteError, RouteTable};

/// How many entries of a dead node's set are cleared per round trip.
const DROP_BATCH: usize = 256;

/// KEYS[1] the user's hash; ARGV[1] the device, ARGV[2] the encoded route. Returns the
/// value it replaced, or nil.
static LOGIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local replaced = redis.call('HGET', KEYS[1], ARGV[1])
         redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
         return replaced",
    )
});

/// KEYS[1] the user's hash; ARGV[1] the device, ARGV[2] the encoded route. Writes it only if
/// the device has no route; returns 1 if it wrote.
static RESTORE: LazyLock<Script> =
    LazyLock::new(|| Script::new("return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])"));

/// KEYS[1] the user's hash; ARGV[1] the device, ARGV[2] `<node>|<connection>|`. Deletes the
/// field only if it still starts with ARGV[2]; returns 1 if it did.
static LOGOUT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local current = redis.call('HGET', KEYS[1], ARGV[1])
         if current and string.sub(current, 1, string.len(ARGV[2])) == ARGV[2] then
           redis.call('HDEL', KEYS[1], ARGV[1])
           return 1
         end
         return 0",
    )
});

/// KEYS[1] the user's hash; ARGV[1] the device, ARGV[2] `<node>|<connection>|`. Marks the
/// field parked (appends `|p`) only if it still starts with ARGV[2]; returns 1 if the field
/// is that connection's (parked now or already).
static PARK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local current = redis.call('HGET', KEYS[1], ARGV[1])
         if current and string.sub(current, 1, string.len(ARGV[2])) == ARGV[2] then
           if string.sub(current, -2) ~= '|p' then
             redis.call('HSET', KEYS[1], ARGV[1], current .. '|p')
           end
           return 1
         end
         return 0",
    )
});

/// The cluster route table: Redis hashes shared by every node.
pub struct RedisRouteTable {
    /// Shared with the node's other Redis seams.
    redis: RedisConnection,
    /// Names the keys; separates deployments and tests sharing one Redis.
    keys: KeyPrefix,
    /// Lookups get `lookup`, everything else `write`.
    timeouts: RedisTimeouts,
}

impl RedisRouteTable {
    /// A route table on `redis`, under `keys`, each call bounded by `timeouts`.
    pub fn new(redis: RedisConnection, keys: KeyPrefix, timeouts: RedisTimeouts) -> Self {
        Self { redis, keys, timeouts }
    }

    /// Removes every route `node` still holds, through its `route:gw` set; returns how
    /// many routes were removed. For a node that died (run by the survivors once its lease
    /// lapsed) or restarted (run by itself before it accepts connections). Routes that moved
    /// to another connection since are left alone. Safe to repeat, and to run while the
    /// node writes new routes: only the set entries it has read are removed.
    ///
    /// # Errors
    /// [`RouteError`] when a step fails or times out; what was removed stays removed, and
    /// running it again finishes the job.
    pub async fn drop_node(&self, node: NodeId) -> Result<usize, RouteError> {
        let gateway = self.keys.gateway(node);
        let mut cursor = 0_u64;
        let mut removed = 0;
        loop {
            let mut scan = redis::cmd("SSCAN");
            scan.arg(&gateway).arg(cursor).arg("COUNT").arg(DROP_BATCH);
            let (next, members): (u64, Vec<String>) =
                self.redis.query("route clean-up (scan)", self.timeouts.write, &scan).await?;
            if !members.is_empty() {
                removed += self.drop_routes(node, &members).await?;
                let mut forget = redis::cmd("SREM");
                forget.arg(&gateway).arg(&members);
                self.redis.query::<()>("route clean-up (node set)", self.timeouts.write, &forget).await?;
            }
            if next == 0 {
                return Ok(removed);
            }
            cursor = next;
        }
    }

    /// Removes the routes named by `members` of `node`'s set that still belong to it.
    async fn drop_routes(&self, node: NodeId, members: &[String]) -> Result<usize, RouteError> {
        let deletions = members.iter().filter_map(|member| {
            let Some((user, device, connection)) = decode_member(member) else {
                tracing::warn!(%node, member, "unreadable entry in a node's route set; dropped");
                return None;
            };
            let mut logout = LOGOUT.prepare_invoke();
            logout.key(self.keys.route(&user)).arg(device.as_str()).arg(owner(node, connection));
            let mut handle = self.redis.handle();
            Some(async move { logout.invoke_async::<u8>(&mut handle).await })
        });
        let dropped = self.redis.guarded("route clean-up", self.timeouts.write, try_join_all(deletions)).await?;
        Ok(dropped.into_iter().filter(|&removed| removed == 1).count())
    }
}

#[async_trait]
impl RouteTable for RedisRouteTable {
    async fn login(&self, route: Route) -> Result<Option<Route>, RouteError> {
        let mut remember = redis::cmd("SADD");
        remember.arg(self.keys.gateway(route.node)).arg(member(&route.user, &route.device, route.connection));
        self.redis.query::<()>("route login (node set)", self.timeouts.write, &remember).await?;
        let mut login = LOGIN.prepare_invoke();
        login.key(self.keys.route(&route.user)).arg(route.device.as_str()).arg(encode(&route));
        let replaced: Option<String> = self.redis.invoke("route login", self.timeouts.write, &login).await?;
        Ok(replaced.and_then(|value| decode(&route.user, &route.device, &value)))
    }

    async fn logout(
        &self,
        user: &UserId,
        device: &DeviceId,
        node: NodeId,
        connection: ConnectionId,
    ) -> Result<bool, RouteError> {
        let mut logout = LOGOUT.prepare_invoke();
        logout.key(self.keys.route(user)).arg(device.as_str()).arg(owner(node, connection));
        let removed: u8 = self.redis.invoke("route logout", self.timeouts.write, &logout).await?;
        // The connection is gone whether or not it still held the route; a set entry left
        // behind by a failure here is skipped by `drop_node`, which removes it.
        let mut forget = redis::cmd("SREM");
        forget.arg(self.keys.gateway(node)).arg(member(user, device, connection));
        if let Err(failure) = self.redis.query::<()>("route logout (node set)", self.timeouts.write, &forget).await {
            tracing::warn!(%user, %device, %failure, "route removed, but not from its node's set");
        }
        Ok(removed == 1)
    }

    /// The node's set keeps its entry: a node that dies with parked sessions has their
    /// routes removed like the others.
    async fn park(
        &self,
        user: &UserId,
        device: &DeviceId,
        node: NodeId,
        connection: ConnectionId,
    ) -> Result<bool, RouteError> {
        let mut park = PARK.prepare_invoke();
        park.key(self.keys.route(user)).arg(device.as_str()).arg(owner(node, connection));
        let parked: u8 = self.redis.invoke("route park", self.timeouts.write, &park).await?;
        Ok(parked == 1)
    }

    async fn restore(&self, route: Route) -> Result<bool, RouteError> {
        let mut remember = redis::cmd("SADD");
        remember.arg(self.keys.gateway(route.node)).arg(member(&route.user, &route.device, route.connection));
        self.redis.query::<()>("route restore (node set)", self.timeouts.write, &remember).await?;
        let mut restore = RESTORE.prepare_invoke();
        restore.key(self.keys.route(&route.user)).arg(route.device.as_str()).arg(encode(&route));
        let wrote: u8 = self.redis.invoke("route restore", self.timeouts.write, &restore).await?;
        Ok(wrote == 1)
    }

    /// One `HGETALL` per user, all sent at once on the multiplexed connection, so the
    /// lookup costs one round trip of latency under one deadline. Not one pipeline: the
    /// users' hashes are in different slots, and `redis`'s cluster client refuses a
    /// pipeline that spans slots (it does not split it), whereas separate commands are
    /// routed each to its own node.
    async fn devices_of(&self, users: &[UserId]) -> Result<HashMap<UserId, Vec<Route>>, RouteError> {
        let lookups = users.iter().map(|user| {
            let mut lookup = redis::cmd("HGETALL");
            lookup.arg(self.keys.route(user));
            let mut handle = self.redis.handle();
            async move { lookup.query_async::<HashMap<String, String>>(&mut handle).await }
        });
        let found = self.redis.guarded("route lookup", self.timeouts.lookup, try_join_all(lookups)).await?;
        Ok(users
            .iter()
            .zip(found)
            .filter_map(|(user, fields)| {
                let routes: Vec<Route> = fields
                    .iter()
                    .filter_map(|(device, value)| {
                        let device = DeviceId::parse(device).ok()?;
                        decode(user, &device, value)
                    })
                    .collect();
                (!routes.is_empty()).then(|| (user.clone(), routes))
            })
            .collect())
    }
}

/// A route's hash value: `<node>|<connection>|<connected_at_ms>`, then `|p` once parked.
/// A node of a release before parking reads a parked route as unreadable and skips it,
/// as it would a route removed at logout.
fn encode(route: &Route) -> String {
    let parked = if route.parked { "|p" } else { "" };
    format!("{}{}{parked}", owner(route.node, route.connection), route.connected_at_ms)
}

/// The start of the hash value of every route held by `connection` on `node`.
fn owner(node: NodeId, connection: ConnectionId) -> String {
    format!("{}|{}|", node.0, connection.0)
}

/// Reads a hash value back; an unreadable one is logged and skipped (one bad field must not
/// stop delivery to the user's other devices).
fn decode(user: &UserId, device: &DeviceId, value: &str) -> Option<Route> {
    let mut parts = value.splitn(4, '|');
    let parsed = (|| {
        let node = NodeId(parts.next()?.parse().ok()?);
        let connection = ConnectionId(parts.next()?.parse().ok()?);
        let connected_at_ms = parts.next()?.parse().ok()?;
        let parked = match parts.next() {
            None => false,
            Some("p") => true,
            Some(_) => return None,
        };
        Some(Route { user: user.clone(), device: device.clone(), node, connection, connected_at_ms, parked })
    })();
    if parsed.is_none() {
        tracing::warn!(%user, %device, value, "unreadable route in Redis; skipped");
    }
    parsed
}

/// An entry of a node's set: `<user>|<device>|<connection>`.
fn member(user: &UserId, device: &DeviceId, connection: ConnectionId) -> String {
    format!("{user}|{device}|{}", connection.0)
}

fn decode_member(member: &str) -> Option<(UserId, DeviceId, ConnectionId)> {
    let mut parts = member.splitn(3, '|');
    let user = UserId::parse(parts.next()?).ok()?;
    let device = DeviceId::parse(parts.next()?).ok()?;
    let connection = ConnectionId(parts.next()?.parse().ok()?);
    Some((user, device, connection))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_set_entries_read_back_as_written() {
        let user = UserId::parse("ann").expect("valid");
        let device = DeviceId::parse("phone").expect("valid");
        let route = Route {
            user: user.clone(),
            device: device.clone(),
            node: NodeId(3),
            connection: ConnectionId(42),
            connected_at_ms: 1_767_225_600_000,
            parked: false,
        };
        let value = encode(&route);
        assert_eq!(value, "3|42|1767225600000");
        assert!(value.starts_with(&owner(NodeId(3), ConnectionId(42))));
        assert!(!value.starts_with(&owner(NodeId(3), ConnectionId(4))), "the separator ends the connection");
        assert_eq!(decode(&user, &device, &value), Some(route.clone()));
        let parked = Route { parked: true, ..route };
        assert_eq!(encode(&parked), "3|42|1767225600000|p");
        assert_eq!(decode(&user, &device, &encode(&parked)), Some(parked));
        assert_eq!(decode(&user, &device, "3|42|1767225600000|x"), None);
        assert_eq!(decode(&user, &device, "3|x|1"), None);
        assert_eq!(decode_member(&member(&user, &device, ConnectionId(42))), Some((user, device, ConnectionId(42))));
        assert_eq!(decode_member("ann|phone"), None);
    }
}

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
//! Every user's hash lives [`RouteLifetimes::ttl`] (`gateway.client_timeout_ms`, as long as
//! a silent connection may stay) unless refreshed: a node's upkeep
//! ([`keep_alive`](RedisRouteTable::keep_alive), three times in that while) walks its own `route:gw` set, refreshes the hashes of the users whose
//! connections it holds, and removes the routes it wrote for connections it no longer holds
//! (a logout that failed) once two passes in a row found them so. A route of a node that is
//! no longer a member and older than the TTL is removed by the upkeep of any node that
//! refreshes its user (the routes of a node id that never came back after the whole cluster
//! stopped, kept alive by the user's other devices); with no device left anywhere the hash
//! lapses. So no route outlives its connection for long, however it ended: a half-open
//! connection is closed by the gateway's client timeout (its logout removes the route), a dead
//! node's routes are removed by the survivors through its `route:gw` set once its lease
//! lapsed, and a route left behind all the same is removed by the first delivery that finds
//! it ([`RouteTable::forget_stale`]) or by the TTL. When a user's last device leaves,
//! `presence:{u:<user>}` records the time (Redis's clock) for [`LAST_SEEN_KEPT`]. The local
//! cache in front of this table is [`CachedRoutes`](crate::routing::cache::CachedRoutes).
//!
//! [`drop_node`]: RedisRouteTable::drop_node

use std::collections::{BTreeSet, HashSet};
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::try_join_all;
use redis::Script;

use super::connection::RedisConnection;
use super::{KeyPrefix, RedisTimeouts};
use crate::maps::HashMap;
use crate::model::{ConnectionId, DeviceId, NodeId, UserId};
use crate::routing::{LAST_SEEN_KEPT, Route, RouteError, RouteTable, now_ms};

/// How many entries of a dead node's set are cleared per round trip.
const DROP_BATCH: usize = 256;

/// Lua shared by the scripts that take a device away: when no device of the user's hash
/// (KEYS[1]) is connected any more (none left, or only parked ones), records Redis's time
/// in KEYS[2] for ARGV[3] ms.
const NOTE_LAST_LEFT: &str = "
    local function note_last_left()
      for _, value in ipairs(redis.call('HVALS', KEYS[1])) do
        if string.sub(value, -2) ~= '|p' then return end
      end
      local now = redis.call('TIME')
      local ms = string.format('%.0f', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
      redis.call('SET', KEYS[2], ms, 'PX', ARGV[3])
    end";

/// KEYS[1] the user's hash; ARGV[1] the device, ARGV[2] the encoded route, ARGV[3] the
/// hash's TTL (ms). Returns the value it replaced, or nil.
static LOGIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local replaced = redis.call('HGET', KEYS[1], ARGV[1])
         redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
         redis.call('PEXPIRE', KEYS[1], ARGV[3])
         return replaced",
    )
});

/// KEYS[1] the user's hash; ARGV[1] the device, ARGV[2] the encoded route, ARGV[3] the
/// hash's TTL (ms). Writes it only if the device has no route; returns 1 if it wrote.
static RESTORE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local wrote = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
         redis.call('PEXPIRE', KEYS[1], ARGV[3])
         return wrote",
    )
});

/// KEYS[1] the user's hash, KEYS[2] when their last device left; ARGV[1] the device,
/// ARGV[2] `<node>|<connection>|`, ARGV[3] how long KEYS[2] is kept (ms). Deletes the field
/// only if it still starts with ARGV[2]; returns 1 if it did.
static LOGOUT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOTE_LAST_LEFT}
         local current = redis.call('HGET', KEYS[1], ARGV[1])
         if current and string.sub(current, 1, string.len(ARGV[2])) == ARGV[2] then
           redis.call('HDEL', KEYS[1], ARGV[1])
           if string.sub(current, -2) ~= '|p' then note_last_left() end
           return 1
         end
         return 0"
    ))
});

/// KEYS[1] the user's hash, KEYS[2] when their last device left; ARGV[1] the device,
/// ARGV[2] `<node>|<connection>|`, ARGV[3] how long KEYS[2] is kept (ms). Marks the field
/// parked (appends `|p`) only if it still starts with ARGV[2]; returns 1 if the field is
/// that connection's (parked now or already).
static PARK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOTE_LAST_LEFT}
         local current = redis.call('HGET', KEYS[1], ARGV[1])
         if current and string.sub(current, 1, string.len(ARGV[2])) == ARGV[2] then
           if string.sub(current, -2) ~= '|p' then
             redis.call('HSET', KEYS[1], ARGV[1], current .. '|p')
             note_last_left()
           end
           return 1
         end
         return 0"
    ))
});

/// KEYS[1] the user's hash; ARGV[1] its TTL (ms), ARGV[2] a time (ms), ARGV[3..] the live
/// nodes. Removes the routes of nodes not among them that connected before ARGV[2], then
/// gives what is left the TTL; returns how many it removed.
static REFRESH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local live = {}
         for i = 3, #ARGV do live[ARGV[i]] = true end
         local removed = 0
         local fields = redis.call('HGETALL', KEYS[1])
         for i = 1, #fields, 2 do
           local node, at = string.match(fields[i + 1], '^(%d+)|%d+|(%d+)')
           if node and not live[node] and tonumber(at) < tonumber(ARGV[2]) then
             redis.call('HDEL', KEYS[1], fields[i])
             removed = removed + 1
           end
         end
         redis.call('PEXPIRE', KEYS[1], ARGV[1])
         return removed",
    )
});

/// How long routes live in Redis without a refresh.
#[derive(Debug, Clone, Copy)]
pub struct RouteLifetimes {
    /// A user's hash and a node's set lapse this long after their last refresh.
    pub ttl: Duration,
}

impl Default for RouteLifetimes {
    /// The default `gateway.client_timeout_ms`.
    fn default() -> Self {
        Self { ttl: Duration::from_secs(90) }
    }
}

/// What one upkeep pass of a node's routes did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Upkeep {
    /// Users whose hash was refreshed.
    pub refreshed: usize,
    /// Routes this node wrote for connections it no longer holds, removed.
    pub left_behind: usize,
    /// Routes of nodes that are no longer members, removed while refreshing their users.
    pub of_departed_nodes: usize,
}

/// The cluster route table: Redis hashes shared by every node.
pub struct RedisRouteTable {
    /// Shared with the node's other Redis seams.
    redis: RedisConnection,
    /// Names the keys; separates deployments and tests sharing one Redis.
    keys: KeyPrefix,
    /// Lookups get `lookup`, everything else `write`.
    timeouts: RedisTimeouts,
    lifetimes: RouteLifetimes,
}

impl RedisRouteTable {
    /// A route table on `redis`, under `keys`, each call bounded by `timeouts`, its routes
    /// living [`RouteLifetimes::default`].
    pub fn new(redis: RedisConnection, keys: KeyPrefix, timeouts: RedisTimeouts) -> Self {
        Self { redis, keys, timeouts, lifetimes: RouteLifetimes::default() }
    }

    /// The same, its routes living `lifetimes`.
    #[must_use]
    pub fn with_lifetimes(self, lifetimes: RouteLifetimes) -> Self {
        Self { lifetimes, ..self }
    }

    /// The hash's TTL, as the scripts take it.
    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.lifetimes.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// One upkeep pass of `node`'s routes: refreshes the hash of every user one of whose
    /// connections `holds` says the node still has (removing on the way their routes of
    /// nodes not among `live` that are older than the TTL), and removes the routes of
    /// connections it no longer has that `suspects` already held from the pass before (a
    /// login writes its route after its session exists, but a pass must not race one);
    /// `suspects` is left holding this pass's. Then refreshes the node's set.
    ///
    /// # Errors
    /// [`RouteError`] when a step fails or times out; the next pass picks up from scratch.
    pub async fn keep_alive(
        &self,
        node: NodeId,
        live: &[NodeId],
        holds: impl Fn(&UserId, ConnectionId) -> bool,
        suspects: &mut HashSet<String>,
    ) -> Result<Upkeep, RouteError> {
        let gateway = self.keys.gateway(node);
        let mut upkeep = Upkeep::default();
        let mut held = BTreeSet::new();
        let mut suspected = HashSet::new();
        let mut gone = Vec::new();
        let mut cursor = 0_u64;
        loop {
            let (next, members) = self.scan_set(&gateway, cursor, "route upkeep (scan)").await?;
            for member in members {
                match decode_member(&member) {
                    Some((user, _, connection)) if holds(&user, connection) => {
                        held.insert(user);
                    }
                    Some(_) if suspects.contains(&member) => gone.push(member),
                    _ => {
                        suspected.insert(member);
                    }
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        for batch in gone.chunks(DROP_BATCH) {
            upkeep.left_behind += self.drop_routes(node, batch).await?;
        }
        *suspects = suspected;
        let ttl = self.ttl_ms();
        let cutoff = now_ms().saturating_sub(ttl);
        let live: Vec<u32> = live.iter().map(|node| node.0).collect();
        let users: Vec<UserId> = held.into_iter().collect();
        for batch in users.chunks(DROP_BATCH) {
            let refreshes = batch.iter().map(|user| {
                let mut refresh = REFRESH.prepare_invoke();
                refresh.key(self.keys.route(user)).arg(ttl).arg(cutoff).arg(&live);
                let mut handle = self.redis.handle();
                async move { refresh.invoke_async::<usize>(&mut handle).await }
            });
            let removed =
                self.redis.guarded("route upkeep (refresh)", self.timeouts.write, try_join_all(refreshes)).await?;
            upkeep.refreshed += batch.len();
            upkeep.of_departed_nodes += removed.into_iter().sum::<usize>();
        }
        let mut expire = redis::cmd("PEXPIRE");
        expire.arg(&gateway).arg(ttl);
        self.redis.query::<()>("route upkeep (node set)", self.timeouts.write, &expire).await?;
        Ok(upkeep)
    }

    /// The arguments of [`LOGOUT`] and [`PARK`] after the device and owner.
    fn last_left_kept_ms() -> u64 {
        u64::try_from(LAST_SEEN_KEPT.as_millis()).unwrap_or(u64::MAX)
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
            let (next, members) = self.scan_set(&gateway, cursor, "route clean-up (scan)").await?;
            if !members.is_empty() {
                removed += self.drop_routes(node, &members).await?;
            }
            if next == 0 {
                return Ok(removed);
            }
            cursor = next;
        }
    }

    /// One step of `SSCAN` over the node set `gateway` from `cursor`: the next cursor (0:
    /// done) and up to about [`DROP_BATCH`] members.
    async fn scan_set(&self, gateway: &str, cursor: u64, what: &'static str) -> Result<(u64, Vec<String>), RouteError> {
        let mut scan = redis::cmd("SSCAN");
        scan.arg(gateway).arg(cursor).arg("COUNT").arg(DROP_BATCH);
        Ok(self.redis.query(what, self.timeouts.write, &scan).await?)
    }

    /// Removes the routes named by `members` of `node`'s set that still belong to it, then
    /// those members from the set; returns how many routes it removed.
    async fn drop_routes(&self, node: NodeId, members: &[String]) -> Result<usize, RouteError> {
        let deletions = members.iter().filter_map(|member| {
            let Some((user, device, connection)) = decode_member(member) else {
                tracing::warn!(%node, member, "unreadable entry in a node's route set; dropped");
                return None;
            };
            let mut logout = LOGOUT.prepare_invoke();
            logout
                .key(self.keys.route(&user))
                .key(self.keys.last_left(&user))
                .arg(device.as_str())
                .arg(owner(node, connection))
                .arg(Self::last_left_kept_ms());
            let mut handle = self.redis.handle();
            Some(async move { logout.invoke_async::<u8>(&mut handle).await })
        });
        let dropped = self.redis.guarded("route clean-up", self.timeouts.write, try_join_all(deletions)).await?;
        let mut forget = redis::cmd("SREM");
        forget.arg(self.keys.gateway(node)).arg(members);
        self.redis.query::<()>("route clean-up (node set)", self.timeouts.write, &forget).await?;
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
        login.key(self.keys.route(&route.user)).arg(route.device.as_str()).arg(encode(&route)).arg(self.ttl_ms());
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
        logout
            .key(self.keys.route(user))
            .key(self.keys.last_left(user))
            .arg(device.as_str())
            .arg(owner(node, connection))
            .arg(Self::last_left_kept_ms());
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
        park.key(self.keys.route(user))
            .key(self.keys.last_left(user))
            .arg(device.as_str())
            .arg(owner(node, connection))
            .arg(Self::last_left_kept_ms());
        let parked: u8 = self.redis.invoke("route park", self.timeouts.write, &park).await?;
        Ok(parked == 1)
    }

    async fn restore(&self, route: Route) -> Result<bool, RouteError> {
        let mut remember = redis::cmd("SADD");
        remember.arg(self.keys.gateway(route.node)).arg(member(&route.user, &route.device, route.connection));
        self.redis.query::<()>("route restore (node set)", self.timeouts.write, &remember).await?;
        let mut restore = RESTORE.prepare_invoke();
        restore.key(self.keys.route(&route.user)).arg(route.device.as_str()).arg(encode(&route)).arg(self.ttl_ms());
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

    async fn last_left(&self, user: &UserId) -> Result<Option<u64>, RouteError> {
        let mut get = redis::cmd("GET");
        get.arg(self.keys.last_left(user));
        let at: Option<String> = self.redis.query("last seen lookup", self.timeouts.write, &get).await?;
        Ok(at.and_then(|at| at.parse().ok()))
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

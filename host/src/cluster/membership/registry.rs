//! The membership's keys in Redis and the four steps on them, each one Lua script.
//!
//! Every script reads the time from Redis (`TIME`), never from the node, so all leases are
//! measured against one clock: a node whose own clock is off cannot make another's lease
//! expire early. Every script touches the three `{cluster}` keys only (one slot).
//!
//! - **join** takes a node id (the pinned one, or the lowest free) only if no live lease
//!   holds it — the check and the write are one atomic step, so two processes can never
//!   take one id — and increments the epoch.
//! - **renew** extends the lease only while it is still this instance's and has not
//!   expired; otherwise the lease is lost. One exception: if neither the lease nor its
//!   holder exists and Redis's data set is not the one the lease was taken in (the
//!   `generation` key names it; FLUSHALL or a restart without persistence wipes it), Redis
//!   forgot the lease rather than let it lapse: it is taken again, as a join would, so the
//!   node re-asserts itself within one heartbeat. A lease removed because it lapsed leaves
//!   the generation as it was, so a renew that arrives late (held up in the network) can
//!   never bring a lapsed lease back.
//! - **leave** removes the lease if it is still this instance's, and increments the epoch.
//! - **view** removes lapsed leases (incrementing the epoch if it removed any) and lists the
//!   live ones with the epoch, so the same epoch always names the same members.
//!
//! A step that changes membership after Redis lost its data first raises the epoch to the
//! highest the node has seen, so epochs never count from zero again while a node survives;
//! a join raises it to the highest owner epoch of the database, so neither do they after a
//! full restart.

use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::cluster::connection::RedisConnection;
use crate::cluster::{KeyPrefix, RedisFailure};
use crate::model::NodeId;

/// Functions every script shares. KEYS[1] the leases (sorted set: node → expiry ms),
/// KEYS[2] the holders (hash: node → `<advertise>|<instance>|<client>`), KEYS[3] the epoch,
/// KEYS[4] the generation, KEYS[5] the settings the cluster's nodes share.
const PRELUDE: &str = "
local leases, holders, epoch, generation, settings = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local function current_generation(candidate)
  redis.call('SET', generation, candidate, 'NX')
  return redis.call('GET', generation)
end
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local function purge(now)
  local lapsed = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
  for _, node in ipairs(lapsed) do
    redis.call('ZREM', leases, node)
    redis.call('HDEL', holders, node)
  end
  return #lapsed
end
local function bump(known)
  local current = tonumber(redis.call('GET', epoch) or '0')
  if current < known then redis.call('SET', epoch, known) end
  return redis.call('INCR', epoch)
end
local function current_epoch()
  return tonumber(redis.call('GET', epoch) or '0')
end
local function listing(at)
  local members = {}
  for i, node in ipairs(redis.call('ZRANGE', leases, 0, -1)) do
    members[i] = {tonumber(node), redis.call('HGET', holders, node)}
  end
  return {at, members}
end
";

/// ARGV[1] the pinned node or '', ARGV[2] the highest node id, ARGV[3] the holder value,
/// ARGV[4] the TTL in ms, ARGV[5] a generation to name the data set by if it has none,
/// ARGV[6] the epoch to count from at least, ARGV[7] the shared settings of the joining node.
/// Returns {0, node, generation, listing} when taken, {1, node, holder, listing} when a live
/// lease holds the pinned node, {2, 0, '', listing} when none is free, {3, 0, settings,
/// listing} when the live nodes' shared settings differ from the joining node's. With no
/// live node, the joining node's settings become the cluster's.
static JOIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}
local now = now_ms()
local purged = purge(now)
local agreed = redis.call('GET', settings)
if redis.call('ZCARD', leases) == 0 or not agreed then
  redis.call('SET', settings, ARGV[7])
elseif agreed ~= ARGV[7] then
  local at = current_epoch()
  if purged > 0 then at = bump(0) end
  return {{3, 0, agreed, listing(at)}}
end
local node = ARGV[1]
local refused, holder = nil, ''
if node ~= '' then
  if redis.call('ZSCORE', leases, node) then
    refused, holder = 1, redis.call('HGET', holders, node) or ''
  end
else
  local taken = {{}}
  for _, held in ipairs(redis.call('ZRANGE', leases, 0, -1)) do taken[tonumber(held)] = true end
  for candidate = 0, tonumber(ARGV[2]) do
    if not taken[candidate] then node = tostring(candidate) break end
  end
  if node == '' then refused, node = 2, '0' end
end
if refused then
  local at = current_epoch()
  if purged > 0 then at = bump(0) end
  return {{refused, tonumber(node), holder, listing(at)}}
end
redis.call('ZADD', leases, 'NX', now + tonumber(ARGV[4]), node)
redis.call('HSET', holders, node, ARGV[3])
local named = current_generation(ARGV[5])
return {{0, tonumber(node), named, listing(bump(tonumber(ARGV[6])))}}"
    ))
});

/// ARGV[1] the node, ARGV[2] this instance's holder value, ARGV[3] the TTL in ms, ARGV[4]
/// the generation the lease was taken in, ARGV[5] a generation to name a new data set by,
/// ARGV[6] the highest epoch the node has seen. Returns {0, ''} extended, {1, generation}
/// taken again in a new data set, {2, holder} lost.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}
local now = now_ms()
local node, mine = ARGV[1], ARGV[2]
local holder = redis.call('HGET', holders, node)
local expiry = redis.call('ZSCORE', leases, node)
if holder == mine and expiry and tonumber(expiry) > now then
  redis.call('ZADD', leases, 'XX', now + tonumber(ARGV[3]), node)
  return {{0, ''}}
end
if holder or expiry or redis.call('GET', generation) == ARGV[4] then
  return {{2, holder or ''}}
end
redis.call('ZADD', leases, 'NX', now + tonumber(ARGV[3]), node)
redis.call('HSET', holders, node, mine)
bump(tonumber(ARGV[6]))
return {{1, current_generation(ARGV[5])}}"
    ))
});

/// ARGV[1] the node, ARGV[2] this instance's holder value, ARGV[3] the highest epoch the
/// node has seen. Returns {1, listing} if it removed the lease, {0, listing} if the lease
/// was no longer this instance's.
static LEAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}
if redis.call('HGET', holders, ARGV[1]) ~= ARGV[2] then
  return {{0, listing(current_epoch())}}
end
redis.call('ZREM', leases, ARGV[1])
redis.call('HDEL', holders, ARGV[1])
return {{1, listing(bump(tonumber(ARGV[3])))}}"
    ))
});

/// No arguments. Returns the listing after removing lapsed leases.
static VIEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}
if purge(now_ms()) > 0 then return listing(bump(0)) end
return listing(current_epoch())"
    ))
});

/// A listing as Redis sends it: the epoch and (node, holder value) of each live lease.
type RawListing = (u64, Vec<(u32, Option<String>)>);

/// One live member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Member {
    /// Its node id.
    pub node: NodeId,
    /// Where peers connect to it; `None` if its holder entry could not be read (it still
    /// counts on the ring, so that every node builds the same one).
    pub address: Option<SocketAddr>,
    /// Where clients reach it (`host:port`), as nginx's upstream lists it; `None` when it
    /// has none (a wildcard `listen` without `cluster.client_url`).
    pub client: Option<String>,
}

/// The live members under one epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Listing {
    /// The cluster-wide epoch these members go with.
    pub epoch: u64,
    /// Sorted by node id.
    pub members: Vec<Member>,
}

impl Listing {
    fn from_raw((epoch, raw): RawListing) -> Self {
        let mut members: Vec<Member> = raw
            .into_iter()
            .map(|(node, holder)| Member {
                node: NodeId(node),
                address: holder.as_deref().and_then(address),
                client: holder.as_deref().and_then(client_address),
            })
            .collect();
        members.sort_by_key(|member| member.node);
        Self { epoch, members }
    }
}

/// What a join came to.
#[derive(Debug)]
pub(super) enum Joined {
    /// The lease on `node` is this instance's, taken in data set `generation`.
    Took { node: NodeId, generation: String, listing: Listing },
    /// A live lease holds the pinned node; `holder` is its holder value.
    Clash { node: NodeId, holder: String },
    /// Every node id is leased.
    Full,
    /// The live nodes share `settings`, which are not the joining node's.
    Mismatch { settings: String },
}

/// What a renew came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Renewed {
    /// The lease runs one TTL from when Redis ran the renew.
    Extended,
    /// Redis had lost its data; the lease is taken again, in data set `generation`.
    Reasserted { generation: String },
    /// The lease lapsed or another instance holds it (`holder`, empty if none).
    Lost { holder: String },
}

/// The membership keys of one deployment, and the steps on them.
pub(super) struct Registry {
    /// Shared with the node's other Redis seams.
    redis: RedisConnection,
    /// `node:{cluster}:` `leases`, `holders`, `epoch`, `generation` and `settings`.
    keys: [String; 5],
}

impl Registry {
    pub(super) fn new(redis: RedisConnection, prefix: &KeyPrefix) -> Self {
        let keys = [
            prefix.node_leases(),
            prefix.node_holders(),
            prefix.cluster_epoch(),
            prefix.cluster_generation(),
            prefix.cluster_settings(),
        ];
        Self { redis, keys }
    }

    fn prepare(&self, script: &'static Script) -> redis::ScriptInvocation<'static> {
        let mut invocation = script.prepare_invoke();
        for key in &self.keys {
            invocation.key(key);
        }
        invocation
    }

    /// Takes `pinned`, or the lowest free id up to `max_node`, for `holder`, with a lease of
    /// `ttl` (also the longest it waits for Redis); the epoch it moves to is above
    /// `epoch_floor`. Refused when the live nodes share other `settings`.
    pub(super) async fn join(
        &self,
        pinned: Option<NodeId>,
        max_node: u32,
        holder: &str,
        epoch_floor: u64,
        ttl: Duration,
        settings: &str,
    ) -> Result<Joined, RedisFailure> {
        let mut join = self.prepare(&JOIN);
        join.arg(pinned.map(|node| node.to_string()).unwrap_or_default())
            .arg(max_node)
            .arg(holder)
            .arg(millis(ttl))
            .arg(new_generation())
            .arg(epoch_floor)
            .arg(settings);
        let (status, node, text, listing): (u8, u32, String, RawListing) =
            self.redis.invoke("membership join", ttl, &join).await?;
        Ok(match status {
            0 => Joined::Took { node: NodeId(node), generation: text, listing: Listing::from_raw(listing) },
            1 => Joined::Clash { node: NodeId(node), holder: text },
            3 => Joined::Mismatch { settings: text },
            _ => Joined::Full,
        })
    }

    /// Extends `node`'s lease if `holder` still holds it (taken in data set `generation`).
    pub(super) async fn renew(
        &self,
        node: NodeId,
        holder: &str,
        generation: &str,
        ttl: Duration,
        known_epoch: u64,
        limit: Duration,
    ) -> Result<Renewed, RedisFailure> {
        let mut renew = self.prepare(&RENEW);
        renew.arg(node.0).arg(holder).arg(millis(ttl)).arg(generation).arg(new_generation()).arg(known_epoch);
        let (status, text): (u8, String) = self.redis.invoke("membership renew", limit, &renew).await?;
        Ok(match status {
            0 => Renewed::Extended,
            1 => Renewed::Reasserted { generation: text },
            _ => Renewed::Lost { holder: text },
        })
    }

    /// Gives up `node`'s lease if `holder` still holds it; returns whether it did and the
    /// members left.
    pub(super) async fn leave(
        &self,
        node: NodeId,
        holder: &str,
        known_epoch: u64,
        limit: Duration,
    ) -> Result<(bool, Listing), RedisFailure> {
        let mut leave = self.prepare(&LEAVE);
        leave.arg(node.0).arg(holder).arg(known_epoch);
        let (removed, listing): (u8, RawListing) = self.redis.invoke("membership leave", limit, &leave).await?;
        Ok((removed == 1, Listing::from_raw(listing)))
    }

    /// The live members, after removing lapsed leases.
    pub(super) async fn view(&self, limit: Duration) -> Result<Listing, RedisFailure> {
        let view = self.prepare(&VIEW);
        let listing: RawListing = self.redis.invoke("membership view", limit, &view).await?;
        Ok(Listing::from_raw(listing))
    }
}

/// The value of a holder entry: where peers reach the node, which instance holds it, and
/// where clients reach it (`host:port`, empty when it has no client address).
pub(super) fn holder_value(advertise: SocketAddr, instance: &str, client: Option<&str>) -> String {
    format!("{advertise}|{instance}|{}", client.unwrap_or_default())
}

/// The advertised address in a holder value (an address holds no `|`).
pub(super) fn address(holder: &str) -> Option<SocketAddr> {
    holder.split_once('|').and_then(|(address, _)| address.parse().ok())
}

/// The client address in a holder value; `None` when empty or written by an older node.
pub(super) fn client_address(holder: &str) -> Option<String> {
    holder.splitn(3, '|').nth(2).filter(|client| !client.is_empty()).map(str::to_owned)
}

/// A name for a data set that has none yet.
fn new_generation() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_value_carries_the_address_of_either_family() {
        for advertise in ["10.0.0.2:7071", "[::1]:7071"] {
            let advertise: SocketAddr = advertise.parse().expect("valid");
            assert_eq!(address(&holder_value(advertise, "00ff", None)), Some(advertise));
            let holder = holder_value(advertise, "00ff", Some("10.0.0.2:7070"));
            assert_eq!(
                (address(&holder), client_address(&holder).as_deref()),
                (Some(advertise), Some("10.0.0.2:7070"))
            );
        }
        assert_eq!(address("garbage"), None);
        assert_eq!(address(""), None);
    }

    #[test]
    fn a_listing_is_sorted_and_keeps_members_without_an_address() {
        let listing = Listing::from_raw((4, vec![(3, Some("10.0.0.3:1|a".into())), (1, None)]));
        assert_eq!(listing.epoch, 4);
        assert_eq!(listing.members[0], Member { node: NodeId(1), address: None, client: None });
        assert_eq!(listing.members[1].address, "10.0.0.3:1".parse().ok());
    }
}

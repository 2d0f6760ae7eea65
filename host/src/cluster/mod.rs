//! Cluster mode's shared state: the Redis implementations of the seams every node must see
//! alike.
//!
//! In cluster mode N nodes of the same binary serve one deployment: a device may be
//! connected to any node, a conversation is owned by one node of the ring, and a retry may
//! reach another node than the original. What one node learns about routes, room
//! subscribers and dedup marks must therefore be visible to all of them, so these seams live
//! in Redis rather than in the process:
//!
//! | seam | embedded | here |
//! |---|---|---|
//! | [`RouteTable`](crate::routing::RouteTable) | `MemoryRouteTable` | [`RedisRouteTable`] |
//! | [`RoomDirectory`](crate::routing::rooms::RoomDirectory) | `MemoryRoomDirectory` | [`RedisRoomDirectory`] |
//! | [`DedupMarks`](crate::pipeline::dedup::DedupMarks) | `LocalDedup` | [`RedisDedup`] |
//! | [`PluginKv`](herald_plugin_runtime::PluginKv) (plugin runtime) | `MemoryKv` | [`RedisPluginKv`] |
//! | [`RateLimiter`](herald_plugin_runtime::RateLimiter) (plugin runtime) | `MemoryLimiter` | [`RedisRateLimiter`] |
//! | [`NodeBus`](crate::routing::bus::NodeBus) | `LocalBus` | [`peer::PeerBus`]: TCP links between nodes, not Redis |
//! | [`LedgerStore`](crate::delivery::ledgers::LedgerStore) | none (embedded mode has no home nodes) | [`RedisLedgers`], with `cluster.placement` set |
//!
//! `node.rs` picks one implementation per seam once, at start-up, when `cluster.redis_url`
//! is set (ARCHITECTURE.md §5); nothing above the seams asks which mode it runs in. All
//! three share one [`RedisConnection`] (a multiplexed connection that reconnects by itself).
//!
//! # Keys
//!
//! Every key starts with a [`KeyPrefix`] (`herald:` by default; tests use their own) and
//! carries a hash tag, so that each script and each multi-key step touches keys of one
//! Redis Cluster slot and never fails with `CROSSSLOT`:
//!
//! | key | type | holds | TTL |
//! |---|---|---|---|
//! | `route:{u:<user>}` | hash | device → `<node>\|<connection>\|<connected_at_ms>`, then `\|p` once parked | `gateway.client_timeout_ms`, refreshed by the nodes holding its devices ([`RedisRouteTable::keep_alive`]); a node removes its routes at logout, and a dead node's are removed through its `route:gw` set |
//! | `route:gw:{n:<node>}` | set | `<user>\|<device>\|<connection>` of every route the node wrote | the same, refreshed by the node; emptied by [`RedisRouteTable::drop_node`] |
//! | `presence:{u:<user>}` | string | when the user's last device left (ms, Redis's clock) | a day ([`LAST_SEEN_KEPT`](crate::routing::LAST_SEEN_KEPT)) |
//! | `dedup:{u:<user>}:<client_msg_id>` | string | `pending`, then `stored\|<message_id>\|<seq>\|<conversation>` | `pending`: [`MarkLifetimes::pending_ttl`]; stored: [`MarkLifetimes::ttl`] |
//! | `room:{r:<room>}:nodes` | set | the nodes with subscribers of the room | none: the last subscriber leaving removes the node |
//! | `kv:{p:<plugin>:<key>}` | string | a value a plugin stored in its KV | the plugin's TTL, or none |
//! | `limit:{p:<plugin>:<key>}` | string | a plugin rate-limit bucket's theoretical arrival time (GCRA, ms of Redis's clock) | until that time: the bucket is full again |
//! | `node:{cluster}:leases` | sorted set | each leased node id, scored by its lease's expiry (ms, Redis's clock) | none: lapsed entries are removed by [`membership`]'s view script |
//! | `node:{cluster}:holders` | hash | node id → `<advertise>\|<instance token>\|<client host:port>` (the last part is nginx's upstream entry under `cluster.placement`) | none: removed with the lease |
//! | `node:{cluster}:settings` | string | `virtual_nodes=<n> placement=<mode>`: what every node must share, written by a join that finds no live node, compared by every other join | none |
//! | `node:{cluster}:epoch` | string | the counter every membership change increments | none |
//! | `node:{cluster}:generation` | string | a random name of Redis's data set, to tell a forgotten lease from a lapsed one | none |
//! | `ledger:{a:<client>:<slot>}` | hash | `<user>\|<device>` → the device's saved ledger (`SavedLedger`, protobuf) on the node clients reach at `<client>` (`host:port`); 64 slots by CRC32 of the user ([`redis_ledgers`]) | a day from its last write |
//! | `ledger:{a:<client>}:as_of` | string | when that node's saved ledgers were last all true (ms, the node's clock) | a day from its last write |
//! | `node:{cluster}:clients` | hash | node id → the URL clients reach it at, which a draining node's `go_away` names ([`client_urls`]) | none: removed when the node drains and when it leaves; readers skip nodes without a live lease |
//!
//! Names are `[A-Za-z0-9._@-]` (model.rs), so a name never contains `{`, `}`, `|` or `:`
//! and cannot break a hash tag or a field encoding. Plugin names and the keys plugins choose
//! are arbitrary text: [`plugin_state`] escapes `%`, braces, control characters (and `:` in
//! the plugin name) as `%XX`, so they cannot break the tag either.
//!
//! # Failures
//!
//! Every call carries a deadline ([`RedisTimeouts`]): lookups on the send and fan-out path
//! are short (50 ms by default) so a slow Redis costs a bounded delay, never a stalled
//! pipeline. A failed or late call becomes the seam's error
//! ([`RouteError`](crate::routing::RouteError), naming Redis and the step); the dedup seam,
//! which cannot fail, lets the send through instead and leaves duplicates to the unique index
//! in storage (see [`redis_dedup`]).

pub mod client_urls;
pub mod connection;
pub mod keys;
pub mod membership;
pub mod nginx_conf;
pub mod peer;
pub mod plugin_notices;
pub mod plugin_state;
pub mod redis_dedup;
pub mod redis_ledgers;
pub mod redis_rooms;
pub mod redis_routes;

use std::time::Duration;

pub use client_urls::ClientUrls;
pub use connection::{RedisConnection, RedisFailure};
pub use keys::{InvalidPrefix, KeyPrefix};
pub use plugin_state::{RedisPluginKv, RedisRateLimiter};
pub use redis_dedup::{MarkLifetimes, RedisDedup};
pub use redis_ledgers::RedisLedgers;
pub use redis_rooms::RedisRoomDirectory;
pub use redis_routes::{RedisRouteTable, RouteLifetimes, Upkeep};

/// How long a call to Redis may take before it counts as failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisTimeouts {
    /// Reads on the hot path: route lookups for fan-out, taking a dedup mark, a room's
    /// nodes. Past it a device counts as offline (it syncs) and a send is let through.
    pub lookup: Duration,
    /// Writes: login, logout, completing or cancelling a mark, joining or leaving a room,
    /// and each step of dropping a dead node's routes.
    pub write: Duration,
}

impl Default for RedisTimeouts {
    fn default() -> Self {
        Self { lookup: Duration::from_millis(50), write: Duration::from_millis(500) }
    }
}

//! `[cluster]`: the settings of cluster mode (docs/ARCHITECTURE.md §5). Checked with the
//! rest in [`Config::validate`](super::Config::validate).

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[cluster]`: many nodes sharing Redis and one MySQL/MariaDB or PostgreSQL database.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// `redis://host:port/db` turns cluster mode on (unset: embedded mode).
    pub redis_url: Option<String>,
    /// Where this node accepts node-to-node links.
    pub peer_listen: SocketAddr,
    /// What this node tells the others to connect to; unset: `peer_listen`.
    pub advertise: Option<SocketAddr>,
    /// Shared by every node; authenticates node-to-node links. Required outside dev mode.
    pub secret: Option<String>,
    /// How long a node's lease lives without a renew: the longest a dead node's
    /// conversations wait for a new owner.
    pub lease_ttl_ms: u64,
    /// Points per node on the ring; every node of a cluster must use the same count.
    pub virtual_nodes: u32,
    /// Prefix of every Redis key, so several deployments can share one Redis.
    pub key_prefix: String,
    /// How long a node keeps a user's routes read from Redis (a login anywhere drops
    /// them at once, everywhere). 0 turns the cache off.
    pub route_cache_ms: u64,
    /// How long past `route_cache_ms` a cached user's routes are still used when Redis
    /// cannot be read (rather than asking every node to push). 0: never.
    pub route_cache_stale_ms: u64,
    /// The URL clients reach this node at (`ws://host:port/v1/ws`), which a draining node's
    /// `go_away` names to send its clients to another node; unset: built from `listen`.
    pub client_url: Option<String>,
    /// Circuit breakers on Redis and on each peer link: this many failed or timed-out calls
    /// in a row open the breaker (seed 001: 10).
    pub breaker_failures: u32,
    /// ...over at least this long (ms): calls failing together in one stall do not open it.
    pub breaker_span_ms: u64,
    /// How long an open breaker refuses calls at once before it lets one through to probe
    /// (seed 001: 5 s).
    pub breaker_open_ms: u64,
}

/// The secret dev mode uses when none is set (dev mode listens on loopback only).
pub const DEV_CLUSTER_SECRET: &str = "herald-dev-cluster-secret";

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            redis_url: None,
            peer_listen: SocketAddr::from(([127, 0, 0, 1], 7071)),
            advertise: None,
            secret: None,
            lease_ttl_ms: 3_000,
            virtual_nodes: 160,
            key_prefix: "herald:".to_owned(),
            route_cache_ms: 3_000,
            route_cache_stale_ms: 30_000,
            client_url: None,
            breaker_failures: 10,
            breaker_span_ms: 1_000,
            breaker_open_ms: 5_000,
        }
    }
}

impl ClusterConfig {
    /// Whether cluster mode is on.
    pub fn enabled(&self) -> bool {
        self.redis_url.as_deref().is_some_and(|url| !url.is_empty())
    }

    /// What the others connect to.
    pub fn advertise(&self) -> SocketAddr {
        self.advertise.unwrap_or(self.peer_listen)
    }

    /// The secret links are authenticated with: the configured one, or dev mode's.
    pub fn secret(&self, dev: bool) -> Option<&str> {
        match self.secret.as_deref().filter(|secret| !secret.is_empty()) {
            Some(secret) => Some(secret),
            None => dev.then_some(DEV_CLUSTER_SECRET),
        }
    }

    /// How long routes are cached.
    pub fn route_cache_ttl(&self) -> Duration {
        Duration::from_millis(self.route_cache_ms)
    }

    /// The longest age at which cached routes are used when Redis cannot be read (zero:
    /// never).
    pub fn route_cache_stale(&self) -> Duration {
        match self.route_cache_stale_ms {
            0 => Duration::ZERO,
            past => Duration::from_millis(self.route_cache_ms.saturating_add(past)),
        }
    }

    /// The lease TTL.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }

    /// The circuit breakers' setting.
    pub fn breaker(&self) -> crate::breaker::BreakerConfig {
        crate::breaker::BreakerConfig {
            failures: self.breaker_failures,
            span: Duration::from_millis(self.breaker_span_ms),
            open_for: Duration::from_millis(self.breaker_open_ms),
        }
    }
}

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
    /// Lets node-to-node links run in plain text off loopback, for a private network the
    /// operator trusts. Off, a node whose links leave loopback needs `[tls]`: the handshake
    /// proves `secret` once, when a link opens, and nothing guards the frames after it.
    /// Ignored when `[tls]` is set (links are TLS then).
    pub plaintext_peers: bool,
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
    /// in a row open the breaker (docs/decisions/0001).
    pub breaker_failures: u32,
    /// ...over at least this long (ms): calls failing together in one stall do not open it.
    pub breaker_span_ms: u64,
    /// How long an open breaker refuses calls at once before it lets one through to probe:
    /// long enough for a restarting dependency to come back, short enough that a recovered
    /// one is used again within seconds.
    pub breaker_open_ms: u64,
    /// How clients' connections are spread over the nodes: `none` (by whatever balancer is
    /// in front), or by nginx hashing `?user=` (`nginx-consistent`, `nginx-hash`), which
    /// gives every user a home node that Herald computes as nginx does. The same on every
    /// node of a cluster (checked at join).
    pub placement: Placement,
    /// With `placement` set: save the devices' ledgers in Redis (about once a second, and at
    /// shutdown) and, on start, park those of the devices whose home this node is, so that
    /// a restarted node resumes its devices instead of backfilling them in full.
    pub restore_devices: bool,
}

/// `cluster.placement`: which node a user's connections are meant to reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Any node: users have no home (a plain load balancer, or none).
    #[default]
    None,
    /// nginx's `hash $arg_user consistent;` over the live nodes' client addresses: a node
    /// joining or leaving moves about 1/n of the users.
    NginxConsistent,
    /// nginx's plain `hash $arg_user;`: a node joining or leaving moves most users.
    NginxHash,
}

impl Placement {
    /// The name the setting takes (`none`, `nginx-consistent`, `nginx-hash`).
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::NginxConsistent => "nginx-consistent",
            Self::NginxHash => "nginx-hash",
        }
    }

    /// The setting named `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::None, Self::NginxConsistent, Self::NginxHash].into_iter().find(|placement| placement.name() == name)
    }
}

/// By hand, so that a wrong value is refused naming the allowed ones (the config loader's
/// own enum error names neither).
impl<'de> Deserialize<'de> for Placement {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Self::from_name(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "cluster.placement must be \"none\", \"nginx-consistent\" or \"nginx-hash\", not {name:?}"
            ))
        })
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
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
            plaintext_peers: false,
            lease_ttl_ms: 3_000,
            virtual_nodes: 160,
            key_prefix: "herald:".to_owned(),
            route_cache_ms: 3_000,
            route_cache_stale_ms: 30_000,
            client_url: None,
            breaker_failures: 10,
            breaker_span_ms: 1_000,
            breaker_open_ms: 5_000,
            placement: Placement::None,
            restore_devices: true,
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

    /// Whether node-to-node traffic stays on this machine: the address links are accepted
    /// on and the one the others dial are both loopback (dev mode, tests, several nodes on
    /// one host). A wildcard such as `0.0.0.0` is not: it accepts links from the network.
    pub fn links_stay_on_loopback(&self) -> bool {
        let loopback = |address: SocketAddr| address.ip().to_canonical().is_loopback();
        loopback(self.peer_listen) && loopback(self.advertise())
    }

    /// Checks that links can be trusted where they run: on loopback only in dev mode
    /// (whose secret is built in), and elsewhere over TLS (`tls_enabled`) unless
    /// `plaintext_peers` says the network is private.
    ///
    /// # Errors
    /// What is wrong and which settings fix it.
    pub fn check_links(&self, dev: bool, tls_enabled: bool) -> Result<(), String> {
        if self.links_stay_on_loopback() {
            return Ok(());
        }
        if dev {
            return Err(format!(
                "dev mode links nodes on loopback only, but cluster.peer_listen is {} and cluster.advertise {}",
                self.peer_listen,
                self.advertise()
            ));
        }
        if tls_enabled || self.plaintext_peers {
            return Ok(());
        }
        Err(format!(
            "node-to-node links would cross the network in plain text: cluster.peer_listen is {} and \
             cluster.advertise {}, not both loopback, and [tls] is not set. The handshake proves cluster.secret \
             once; the frames after it are neither encrypted nor authenticated. Set tls.cert_file and \
             tls.key_file (HERALD_TLS__CERT_FILE, HERALD_TLS__KEY_FILE) so links are TLS, or, on a private network \
             no one else can reach, set cluster.plaintext_peers = true (HERALD_CLUSTER__PLAINTEXT_PEERS=true)",
            self.peer_listen,
            self.advertise()
        ))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn links(peer_listen: &str, advertise: Option<&str>, plaintext_peers: bool) -> ClusterConfig {
        ClusterConfig {
            peer_listen: peer_listen.parse().expect("peer_listen"),
            advertise: advertise.map(|address| address.parse().expect("advertise")),
            plaintext_peers,
            ..ClusterConfig::default()
        }
    }

    #[test]
    fn links_on_loopback_need_no_tls() {
        for (listen, advertise) in [
            ("127.0.0.1:7071", None),
            ("127.0.0.1:0", Some("127.0.0.2:7071")),
            ("[::1]:7071", None),
            ("[::ffff:127.0.0.1]:7071", None),
        ] {
            let cluster = links(listen, advertise, false);
            assert!(cluster.links_stay_on_loopback(), "{listen} {advertise:?}");
            assert_eq!(cluster.check_links(false, false), Ok(()), "{listen} {advertise:?}");
            assert_eq!(cluster.check_links(true, false), Ok(()), "dev mode: {listen} {advertise:?}");
        }
    }

    #[test]
    fn links_off_loopback_need_tls_or_the_opt_out() {
        // Either address off loopback takes the links off this machine: a wildcard accepts
        // them from the network; a public advertise sends them across it (a NAT, a proxy).
        for (listen, advertise) in [
            ("0.0.0.0:7071", None),
            ("[::]:7071", None),
            ("0.0.0.0:0", Some("127.0.0.1:7071")),
            ("10.0.0.5:7071", None),
            ("127.0.0.1:7071", Some("10.0.0.5:7071")),
        ] {
            let cluster = links(listen, advertise, false);
            assert!(!cluster.links_stay_on_loopback(), "{listen} {advertise:?}");
            let error = cluster.check_links(false, false).expect_err("plain text off loopback");
            for needed in ["plain text", "HERALD_TLS__CERT_FILE", "cluster.plaintext_peers = true", listen] {
                assert!(error.contains(needed), "{needed:?} missing in: {error}");
            }
            assert_eq!(cluster.check_links(false, true), Ok(()), "TLS: {listen} {advertise:?}");
            let opted_out = links(listen, advertise, true);
            assert_eq!(opted_out.check_links(false, false), Ok(()), "opted out: {listen} {advertise:?}");
            // Dev mode's secret is built in: neither TLS nor the opt-out takes it off loopback.
            for (tls, cluster) in [(false, &opted_out), (true, &cluster)] {
                let error = cluster.check_links(true, tls).expect_err("dev mode off loopback");
                assert!(error.contains("dev mode links nodes on loopback only"), "{error}");
            }
        }
    }
}

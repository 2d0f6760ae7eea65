//! Where clients reach each node: the URL a node serves `/v1/ws` at, published in Redis so
//! that a node shutting down can name another live node in its `go_away` (PROTOCOL.md,
//! "Shutdown: `go_away`"), instead of sending every client back to the same address.
//!
//! `node:{cluster}:clients` is a hash of node id → URL, tagged like the membership keys
//! whose node ids it follows. A node writes its entry once it accepts connections (not at
//! join: a URL must never name a node that would refuse the connection), writes it again
//! after Redis lost its data, and removes it when it starts draining and again when it
//! leaves. An entry is only a hint: readers keep the entries of nodes holding a live lease,
//! so one left behind by a killed node is never handed out, and the next process leasing
//! that id overwrites it. The hash holds at most one entry per node id (1024).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use super::connection::{RedisConnection, RedisFailure};
use super::{KeyPrefix, RedisTimeouts};
use crate::model::NodeId;

/// The path the gateway is mounted at (PROTOCOL.md, "Transport").
const WEBSOCKET_PATH: &str = "/v1/ws";

/// A `cluster.client_url` no client could use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cluster.client_url (HERALD_CLUSTER__CLIENT_URL) {0:?} must be a ws:// or wss:// URL without spaces, such as \
     wss://node-1.chat.example.com/v1/ws: draining nodes send their clients there"
)]
pub struct InvalidClientUrl(pub String);

/// Checks a configured client URL before the node joins: it is handed to clients as is.
///
/// # Errors
/// [`InvalidClientUrl`] unless it is `ws://` or `wss://` followed by something, without
/// whitespace or control characters.
pub fn check_client_url(url: &str) -> Result<(), InvalidClientUrl> {
    let rest = url.strip_prefix("wss://").or_else(|| url.strip_prefix("ws://")).unwrap_or_default();
    if rest.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(InvalidClientUrl(url.to_owned()));
    }
    Ok(())
}

/// The URL clients reach a node at: `configured` (`cluster.client_url`, see
/// [`check_client_url`]), or `ws://<listening>/v1/ws` built from the address the gateway
/// is bound to (with the port it was given when `listen` asked for port 0). `None` when
/// nothing is configured and `listening` is a wildcard address (`0.0.0.0`, `::`), which no
/// client can dial: such a node is then never named in a `go_away`, rather than named
/// wrongly.
pub fn client_url(configured: Option<&str>, listening: SocketAddr) -> Option<String> {
    match configured {
        Some(url) => Some(url.to_owned()),
        None if listening.ip().is_unspecified() => None,
        None => Some(format!("ws://{listening}{WEBSOCKET_PATH}")),
    }
}

/// The `host:port` of a client URL, as nginx's upstream lists the node: the authority
/// without user info, with the scheme's port (80 for `ws://`, 443 for `wss://`) when the
/// URL names none. `None` for a URL that is not `ws://` or `wss://`.
pub fn client_address(url: &str) -> Option<String> {
    let (rest, port) = match url.strip_prefix("wss://") {
        Some(rest) => (rest, "443"),
        None => (url.strip_prefix("ws://")?, "80"),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if host_port.is_empty() {
        return None;
    }
    let has_port = match host_port.rsplit_once(':') {
        Some((host, port)) => !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && !host.ends_with(':'),
        None => false,
    };
    // An IPv6 address without a port ends with `]`: its colons are not a port's.
    Some(if has_port && !host_port.ends_with(']') { host_port.to_owned() } else { format!("{host_port}:{port}") })
}

/// The client URLs of a cluster's nodes, in Redis.
pub struct ClientUrls {
    /// Shared with the node's other Redis seams.
    redis: RedisConnection,
    /// Names the hash; separates deployments and tests sharing one Redis.
    keys: KeyPrefix,
    /// Every call gets the `write` deadline: none is on a client's path (they run at start,
    /// after Redis lost its data, and at shutdown).
    timeouts: RedisTimeouts,
}

impl ClientUrls {
    /// The client URLs on `redis`, under `keys`, each call bounded by `timeouts.write`.
    pub fn new(redis: RedisConnection, keys: KeyPrefix, timeouts: RedisTimeouts) -> Self {
        Self { redis, keys, timeouts }
    }

    /// Records that clients reach `node` at `url`, replacing what an earlier holder of the
    /// id wrote.
    ///
    /// # Errors
    /// [`RedisFailure`] when Redis fails or does not answer in time.
    pub async fn publish(&self, node: NodeId, url: &str) -> Result<(), RedisFailure> {
        let mut publish = redis::cmd("HSET");
        publish.arg(self.keys.node_clients()).arg(node.0).arg(url);
        self.redis.query("client URL publish", self.timeouts.write, &publish).await
    }

    /// Removes `node`'s URL, so no draining node sends clients there any more. Removing one
    /// that is not there is not an error.
    ///
    /// # Errors
    /// [`RedisFailure`] when Redis fails or does not answer in time.
    pub async fn withdraw(&self, node: NodeId) -> Result<(), RedisFailure> {
        let mut withdraw = redis::cmd("HDEL");
        withdraw.arg(self.keys.node_clients()).arg(node.0);
        self.redis.query("client URL withdrawal", self.timeouts.write, &withdraw).await
    }

    /// Every URL published, by node. Entries whose field is not a node id (written by
    /// something else) are skipped; the caller keeps those of live members.
    ///
    /// # Errors
    /// [`RedisFailure`] when Redis fails or does not answer in time.
    pub async fn all(&self) -> Result<BTreeMap<NodeId, String>, RedisFailure> {
        let mut read = redis::cmd("HGETALL");
        read.arg(self.keys.node_clients());
        let entries: HashMap<String, String> =
            self.redis.query("client URL lookup", self.timeouts.write, &read).await?;
        Ok(entries.into_iter().filter_map(|(node, url)| Some((NodeId(node.parse().ok()?), url))).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_is_the_configured_one_or_built_from_the_bound_address() {
        let bound: SocketAddr = "127.0.0.1:40123".parse().expect("valid");
        assert_eq!(client_url(None, bound).as_deref(), Some("ws://127.0.0.1:40123/v1/ws"));
        let v6: SocketAddr = "[fd00::7]:7070".parse().expect("valid");
        assert_eq!(client_url(None, v6).as_deref(), Some("ws://[fd00::7]:7070/v1/ws"));
        let configured = Some("wss://node-1.chat.example.com/v1/ws");
        assert_eq!(client_url(configured, bound).as_deref(), configured);
        let wildcard: SocketAddr = "0.0.0.0:7070".parse().expect("valid");
        assert_eq!(client_url(None, wildcard), None, "no client can dial 0.0.0.0");
        assert_eq!(client_url(configured, wildcard).as_deref(), configured);
    }

    #[test]
    fn the_client_address_is_the_host_and_port_nginx_dials() {
        assert_eq!(client_address("ws://127.0.0.1:40123/v1/ws").as_deref(), Some("127.0.0.1:40123"));
        assert_eq!(client_address("ws://[fd00::7]:7070/v1/ws").as_deref(), Some("[fd00::7]:7070"));
        assert_eq!(client_address("ws://[fd00::7]/v1/ws").as_deref(), Some("[fd00::7]:80"));
        assert_eq!(
            client_address("wss://node-1.chat.example.com/v1/ws").as_deref(),
            Some("node-1.chat.example.com:443")
        );
        assert_eq!(client_address("ws://node-1:7070").as_deref(), Some("node-1:7070"));
        assert_eq!(client_address("http://node-1:7070/v1/ws"), None);
        assert_eq!(client_address("ws:///v1/ws"), None);
    }

    #[test]
    fn a_configured_url_must_be_a_websocket_url_and_the_refusal_names_the_key() {
        assert!(check_client_url("wss://node-1.chat.example.com/v1/ws").is_ok());
        assert!(check_client_url("ws://10.0.0.7:7070/v1/ws").is_ok());
        for bad in ["http://10.0.0.7:7070/v1/ws", "ws://", "ws://a b/v1/ws", "10.0.0.7:7070", ""] {
            let error = check_client_url(bad).expect_err(bad).to_string();
            assert!(error.starts_with("cluster.client_url (HERALD_CLUSTER__CLIENT_URL)"), "{bad}: {error}");
            assert!(error.contains("ws:// or wss://"), "{bad}: {error}");
        }
    }
}

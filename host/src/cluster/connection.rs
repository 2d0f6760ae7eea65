//! The connection every Redis-backed seam of a node shares, and the one rule all of them
//! follow: no call to Redis without a deadline.
//!
//! [`RedisConnection`] is one of two things, picked by the URL, and the seams cannot tell
//! which:
//! - **one server** (`redis://…`): `redis`'s `ConnectionManager`, one multiplexed TCP
//!   connection (concurrent commands are pipelined on it, so many lookups cost one round
//!   trip of latency) that reconnects in the background after an I/O error;
//! - **a Redis Cluster** (`redis+cluster://host:port[,host:port…]`, the nodes to start
//!   from): `redis`'s cluster connection, one multiplexed connection per master, each
//!   command sent to the master of its key's slot (following `MOVED`/`ASK`, refreshing the
//!   slot map when it changes) and each script loaded on every master. A command or
//!   script whose keys span slots fails there with `CROSSSLOT`, and a pipeline spanning
//!   slots is refused by the client: the keys of cluster mode carry hash tags so that each
//!   script and each multi-key step touches one slot (module doc of [`crate::cluster`]),
//!   and lookups of many users are separate commands, never one pipeline.
//!
//! Cloning it is cheap and shares the connection(s). Either way, the client reconnects
//! after I/O errors by itself.
//!
//! # Circuit breaker
//!
//! The seams' connection carries a [`Breaker`] (`cluster.breaker_failures` failed or
//! timed-out calls in a row over at least `cluster.breaker_span_ms` open it for
//! `cluster.breaker_open_ms`): while it is open, every
//! call fails at once with [`RedisFailure::Unavailable`] instead of waiting out its
//! deadline, so a Redis that stopped answering costs a send nothing but the seam's
//! fallback (a route lookup counts the device as offline — it syncs; a dedup mark lets the
//! send through to the unique index). An error Redis answered with (a script error, a
//! wrong type) is an answer and does not count. The membership's lease has a connection of
//! its own, without a breaker: see [`crate::breaker`].

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, NodeAddress};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture, ScriptInvocation, Value};

use crate::breaker::Breaker;
use crate::routing::RouteError;

/// The scheme that names a Redis Cluster rather than one server.
const CLUSTER_SCHEME: &str = "redis+cluster://";

/// A Redis call that failed or did not answer in time.
#[derive(Debug, thiserror::Error)]
pub enum RedisFailure {
    #[error("cannot connect to Redis at {url}: {reason}; check that it runs and that cluster.redis_url names it")]
    Connect { url: String, reason: String },
    #[error("Redis did not answer {what} within {limit:?}")]
    Timeout { what: &'static str, limit: Duration },
    #[error("Redis failed {what}: {source}")]
    Command {
        what: &'static str,
        #[source]
        source: RedisError,
    },
    #[error("Redis was not asked for {what}: its circuit breaker is open after repeated failures")]
    Unavailable { what: &'static str },
}

impl RedisFailure {
    /// Whether this says Redis is unwell (no answer in time, the connection failed or the
    /// breaker is open) rather than that it answered with an error.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Timeout { .. } | Self::Unavailable { .. } => true,
            Self::Command { source, .. } => unreachable_error(source),
        }
    }
}

/// Whether `error` means Redis could not be reached or stopped answering.
fn unreachable_error(error: &RedisError) -> bool {
    error.is_io_error() || error.is_timeout() || error.is_connection_dropped() || error.is_connection_refusal()
}

impl From<RedisFailure> for RouteError {
    fn from(failure: RedisFailure) -> Self {
        RouteError::new(failure)
    }
}

/// A shared connection to Redis: one server (or a primary behind a proxy), or a Redis
/// Cluster.
#[derive(Clone)]
pub struct RedisConnection {
    /// Multiplexed and reconnecting; each clone shares the same socket(s).
    handle: Handle,
    /// Refuses calls at once while Redis keeps failing; `None`: every call is tried.
    breaker: Option<Breaker>,
}

/// The connection behind a [`RedisConnection`]; run commands on it (`query_async`,
/// `invoke_async`) like on any of `redis`'s async connections, under a deadline
/// ([`within`]).
#[derive(Clone)]
pub(crate) enum Handle {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster: commands go to the master of their slot.
    Cluster(ClusterConnection),
}

impl RedisConnection {
    /// Connects to the Redis at `url`, waiting at most `connect_timeout` for the first
    /// connection: one server (`redis://[user:password@]host:port/db`) or a Redis Cluster
    /// (`redis+cluster://[user:password@]host:port[,host:port…]`, any of its masters; the
    /// others are found from them).
    ///
    /// # Errors
    /// [`RedisFailure::Connect`] when the URL is not valid or Redis cannot be reached in
    /// time (for a cluster: none of the nodes named answers, or it is not a cluster); the
    /// message names the URL without its password.
    pub async fn connect(url: &str, connect_timeout: Duration) -> Result<Self, RedisFailure> {
        Self::connect_with_node_map(url, connect_timeout, &HashMap::new()).await
    }

    /// As [`connect`](Self::connect), for a Redis Cluster whose nodes must be dialled at
    /// other addresses than the ones they announce (in `CLUSTER SLOTS` and redirects):
    /// behind NAT or port forwarding, or through a test's proxy. `node_map` maps an
    /// announced `host:port` to the `host:port` to dial; addresses not in it are dialled as
    /// announced. It does not apply to one server, whose URL already says where to dial.
    ///
    /// # Errors
    /// As [`connect`](Self::connect); also when an entry of `node_map` is not `host:port`.
    pub async fn connect_with_node_map(
        url: &str,
        connect_timeout: Duration,
        node_map: &HashMap<String, String>,
    ) -> Result<Self, RedisFailure> {
        let failed = |reason: String| RedisFailure::Connect { url: redact(url), reason };
        let handle = match cluster_nodes(url) {
            Some(nodes) => Handle::Cluster(
                connect_cluster(nodes.map_err(failed)?, connect_timeout, node_map).await.map_err(failed)?,
            ),
            None => Handle::Single(connect_single(url, connect_timeout).await.map_err(failed)?),
        };
        Ok(Self { handle, breaker: None })
    }

    /// This connection with `breaker` guarding every call made through it.
    #[must_use]
    pub fn with_breaker(mut self, breaker: Breaker) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// The breaker guarding this connection, if any.
    pub fn breaker(&self) -> Option<&Breaker> {
        self.breaker.as_ref()
    }

    /// Runs one command, at most `limit` long.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        what: &'static str,
        limit: Duration,
        command: &Cmd,
    ) -> Result<T, RedisFailure> {
        let mut connection = self.handle();
        self.guarded(what, limit, command.query_async(&mut connection)).await
    }

    /// Runs one script (loading it first if Redis does not know it), at most `limit` long.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        what: &'static str,
        limit: Duration,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, RedisFailure> {
        let mut connection = self.handle();
        self.guarded(what, limit, script.invoke_async(&mut connection)).await
    }

    /// Awaits `call` (made on a [`handle`](Self::handle)) for at most `limit`, through the
    /// breaker: refused at once while it is open, and reported to it after.
    pub(crate) async fn guarded<T>(
        &self,
        what: &'static str,
        limit: Duration,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, RedisFailure> {
        let Some(breaker) = &self.breaker else { return within(what, limit, call).await };
        if !breaker.permits() {
            return Err(RedisFailure::Unavailable { what });
        }
        let outcome = within(what, limit, call).await;
        match &outcome {
            Err(failure) if failure.is_unavailable() => breaker.failure(),
            _ => breaker.success(),
        }
        outcome
    }

    /// A handle on the shared connection, for composing several concurrent calls under one
    /// deadline with [`guarded`](Self::guarded).
    pub(crate) fn handle(&self) -> Handle {
        self.handle.clone()
    }
}

/// One server: a probe, then the reconnecting manager.
async fn connect_single(url: &str, connect_timeout: Duration) -> Result<ConnectionManager, String> {
    let client = redis::Client::open(url).map_err(|error| error.to_string())?;
    // One plain attempt first: the manager retries with backoff, which would hide why
    // Redis cannot be reached (refused, wrong password) behind a bare timeout.
    let probe = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(Some(connect_timeout));
    let mut probe = match tokio::time::timeout(
        connect_timeout,
        client.get_multiplexed_async_connection_with_config(&probe),
    )
    .await
    {
        Ok(Ok(probe)) => probe,
        Ok(Err(error)) => return Err(error.to_string()),
        Err(_) => return Err(format!("no connection within {connect_timeout:?}")),
    };
    // A node of a Redis Cluster answers for its own slots only (`MOVED` for the rest): a
    // deployment half working is worse than one refusing to start. A server (or proxy) that
    // does not answer `INFO` is taken as one server.
    let info: Result<String, _> =
        tokio::time::timeout(connect_timeout, redis::cmd("INFO").arg("cluster").query_async(&mut probe))
            .await
            .unwrap_or(Ok(String::new()));
    if info.is_ok_and(|info| info.lines().any(|line| line.trim() == "cluster_enabled:1")) {
        return Err(format!(
            "this Redis is a node of a Redis Cluster; name the cluster as {CLUSTER_SCHEME}host:port[,host:port…]"
        ));
    }
    // Every call through this type carries its own deadline (`within`), so the manager's
    // response timeout is left off; its connection timeout bounds each (re)connect.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(None)
        .set_max_delay(Duration::from_secs(2));
    match tokio::time::timeout(connect_timeout, ConnectionManager::new_with_config(client, config)).await {
        Ok(Ok(manager)) => Ok(manager),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no connection within {connect_timeout:?}")),
    }
}

/// A Redis Cluster: connects to the nodes named, reads the slot map from them and connects
/// to every master, all within `connect_timeout`.
async fn connect_cluster(
    nodes: Vec<String>,
    connect_timeout: Duration,
    node_map: &HashMap<String, String>,
) -> Result<ClusterConnection, String> {
    let address = |text: &String| text.parse::<NodeAddress>().map_err(|_| format!("{text:?} is not host:port"));
    let map = node_map
        .iter()
        .map(|(announced, dial)| Ok((address(announced)?, address(dial)?)))
        .collect::<Result<HashMap<_, _>, String>>()?;
    // As for one server, no response timeout of the client's own: every call through this
    // type carries its deadline (`within`), retries and redirections included.
    let mut builder = ClusterClientBuilder::new(nodes).connection_timeout(connect_timeout);
    if !map.is_empty() {
        builder = builder.node_address_map(map);
    }
    let client = builder.build().map_err(|error| error.to_string())?;
    match tokio::time::timeout(connect_timeout, client.get_async_connection()).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no connection to the cluster within {connect_timeout:?}")),
    }
}

/// The node URLs of a `redis+cluster://[userinfo@]host:port[,host:port…][/…]` URL, each
/// `redis://[userinfo@]host:port[/…]`; `None` when `url` does not name a cluster, an error
/// when it names no node.
fn cluster_nodes(url: &str) -> Option<Result<Vec<String>, String>> {
    let rest = url.strip_prefix(CLUSTER_SCHEME)?;
    let (authority, path) = rest.find(['/', '?']).map_or((rest, ""), |at| rest.split_at(at));
    let (userinfo, hosts) = authority.rsplit_once('@').map_or(("", authority), |(user, hosts)| (user, hosts));
    let at = if userinfo.is_empty() { String::new() } else { format!("{userinfo}@") };
    let nodes: Vec<String> =
        hosts.split(',').filter(|host| !host.is_empty()).map(|host| format!("redis://{at}{host}{path}")).collect();
    Some(if nodes.is_empty() {
        Err(format!("{CLUSTER_SCHEME} names no node; list them as {CLUSTER_SCHEME}host:port[,host:port…]"))
    } else {
        Ok(nodes)
    })
}

impl ConnectionLike for Handle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(manager) => manager.req_packed_command(cmd),
            Self::Cluster(cluster) => cluster.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(manager) => manager.req_packed_commands(pipeline, offset, count),
            Self::Cluster(cluster) => cluster.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(manager) => manager.get_db(),
            Self::Cluster(cluster) => cluster.get_db(),
        }
    }
}

/// Awaits `call` for at most `limit`; an error or the deadline becomes a [`RedisFailure`]
/// naming `what`.
pub(crate) async fn within<T>(
    what: &'static str,
    limit: Duration,
    call: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisFailure> {
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(limit, call).await;
    metrics::histogram!("herald_redis_call_seconds", "what" => what).record(started.elapsed().as_secs_f64());
    match outcome {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(RedisFailure::Command { what, source }),
        Err(_) => Err(RedisFailure::Timeout { what, limit }),
    }
}

/// `url` without the password, for messages and logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}***{}", &url[..scheme + 3], &url[at..]),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_error_keeps_the_redis_failure_as_its_cause() {
        let error = RouteError::from(RedisFailure::Timeout { what: "HGETALL", limit: Duration::from_millis(50) });
        let failure = error.cause().downcast_ref::<RedisFailure>().expect("the Redis failure itself");
        assert!(failure.is_unavailable());
        let source = std::error::Error::source(&error).expect("a source");
        assert_eq!(source.to_string(), failure.to_string());
        assert!(error.to_string().contains("HGETALL"), "the message says what failed: {error}");
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(redact("redis://user:secret@10.0.0.1:6379/0"), "redis://***@10.0.0.1:6379/0");
        assert_eq!(redact("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
        assert_eq!(
            redact("redis+cluster://:secret@10.0.0.1:7001,10.0.0.2:7001"),
            "redis+cluster://***@10.0.0.1:7001,10.0.0.2:7001"
        );
    }

    #[tokio::test]
    async fn an_unreachable_cluster_fails_to_connect_with_a_clear_message() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
        let url = format!("redis+cluster://:secret@{closed},{closed}");
        let started = tokio::time::Instant::now();
        let error = RedisConnection::connect(&url, Duration::from_millis(500)).await.err().expect("nothing listens");
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("cannot connect to Redis at redis+cluster://***@{closed},{closed}: ")),
            "{message}"
        );
        assert!(!message.contains("secret"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
        let error =
            RedisConnection::connect("redis+cluster://", Duration::from_millis(500)).await.err().expect("no node");
        assert!(error.to_string().contains("names no node"), "{error}");
    }

    #[test]
    fn a_cluster_url_names_each_node_with_the_same_credentials() {
        assert_eq!(cluster_nodes("redis://127.0.0.1:6379/0"), None, "one server");
        assert_eq!(
            cluster_nodes("redis+cluster://127.0.0.1:7001,127.0.0.1:7002"),
            Some(Ok(vec!["redis://127.0.0.1:7001".to_owned(), "redis://127.0.0.1:7002".to_owned()]))
        );
        assert_eq!(
            cluster_nodes("redis+cluster://ann:p%40ss@a:1,[::1]:2/0"),
            Some(Ok(vec!["redis://ann:p%40ss@a:1/0".to_owned(), "redis://ann:p%40ss@[::1]:2/0".to_owned()]))
        );
        assert!(matches!(cluster_nodes("redis+cluster://"), Some(Err(_))));
        assert!(matches!(cluster_nodes("redis+cluster://,/"), Some(Err(_))));
    }
}

//! What the tests of cluster mode's Redis parts share: the Redis to test against, a corner
//! of it per test (a unique key prefix, its keys deleted on drop even when the test
//! panics), and a proxy that can cut Redis off as a partition would. A Redis that cannot be
//! reached fails the test, never skips it.
//!
//! The Redis is `HERALD_TEST_REDIS_URL`, or `redis://127.0.0.1:6379/0`: one server, or a
//! Redis Cluster (`redis+cluster://host:port[,host:port…]`; `scripts/test.sh` runs the
//! Redis-backed tests a second time against a 3-master one, see `ensure_redis_cluster` in
//! `scripts/services.sh`). Every helper works on both:
//! - the test's own plain (blocking) look-ups — [`Scratch::keys_written`],
//!   [`Scratch::forget_everything`], the clean-up on drop — `SCAN` every master of a
//!   cluster (a `SCAN` sees one node's keys only) and delete the keys on the master
//!   holding them, one `DEL` per hash tag (keys of different slots may not share a
//!   command; the keys of one tag vanish together, as when the master is flushed);
//!   [`Scratch::ttl_ms`] goes through `redis`'s cluster client, which routes by key;
//! - [`partitionable_proxy`] of a cluster proxies every master, and [`connect`] to the URL
//!   it returns dials each master through its proxy (the masters announce their own
//!   addresses, which `RedisConnection::connect_with_node_map` translates): cutting the
//!   proxy cuts the whole cluster off, as it cuts a single Redis off, and what goes
//!   through the proxy is the same data set the test's other connections see.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use herald_host::cluster::{KeyPrefix, RedisConnection};

use crate::support::poll::poll;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The scheme of a Redis Cluster URL (as `RedisConnection::connect` reads it).
const CLUSTER_SCHEME: &str = "redis+cluster://";

/// The node map of each cluster proxy URL [`partitionable_proxy`] returned: announced
/// master address → its proxy.
static PROXIED_CLUSTERS: LazyLock<Mutex<HashMap<String, HashMap<String, String>>>> = LazyLock::new(Mutex::default);

pub fn redis_url() -> String {
    std::env::var("HERALD_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".to_owned())
}

/// Connects to `url` (one server, a cluster, or a URL [`partitionable_proxy`] returned) or
/// fails the test saying how to get a Redis.
pub async fn connect(url: &str) -> RedisConnection {
    let node_map = PROXIED_CLUSTERS.lock().expect("proxy registry").get(url).cloned().unwrap_or_default();
    RedisConnection::connect_with_node_map(url, Duration::from_secs(3), &node_map).await.unwrap_or_else(|error| {
        panic!(
            "{error}. These tests need a real Redis: start one (redis-server --daemonize yes --port 6379 \
             --save '' --appendonly no) or set HERALD_TEST_REDIS_URL to one (a Redis Cluster: \
             redis+cluster://host:port,…; scripts/services.sh has ensure_redis_cluster)"
        )
    })
}

/// One test's corner of Redis: a unique key prefix, and its keys deleted on drop (even
/// when the test panics).
pub struct Scratch {
    pub url: String,
    pub keys: KeyPrefix,
    /// A connection of the test's own.
    pub redis: RedisConnection,
}

impl Scratch {
    pub async fn new() -> Self {
        let url = redis_url();
        let redis = connect(&url).await;
        let keys = KeyPrefix::new(&format!("test:{:016x}:", rand::random::<u64>())).expect("a valid prefix");
        Self { url, keys, redis }
    }

    /// Every key under this test's prefix, without the prefix.
    pub fn keys_written(&self) -> BTreeSet<String> {
        let prefix = self.keys.as_str();
        masters(&self.url)
            .expect("the Redis masters")
            .into_iter()
            .flat_map(|node| scan(&mut plain(&node).expect("a plain connection"), prefix).expect("SCAN"))
            .map(|key| key[prefix.len()..].to_owned())
            .collect()
    }

    /// How many connections subscribe to `channel`, over every master.
    pub fn subscribers(&self, channel: &str) -> i64 {
        masters(&self.url)
            .expect("the Redis masters")
            .into_iter()
            .map(|node| {
                let (_, count): (String, i64) = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(channel)
                    .query(&mut plain(&node).expect("a plain connection"))
                    .expect("PUBSUB NUMSUB");
                count
            })
            .sum()
    }

    /// The TTL of one of this test's keys, in ms (-1: none, -2: no such key).
    pub fn ttl_ms(&self, key: &str) -> i64 {
        let mut ttl = redis::cmd("PTTL");
        ttl.arg(format!("{}{key}", self.keys.as_str()));
        match cluster_nodes(&self.url) {
            Some((_, nodes)) => {
                let client = redis::cluster::ClusterClient::new(nodes).expect("a cluster client");
                ttl.query(&mut client.get_connection().expect("a cluster connection")).expect("PTTL")
            }
            None => ttl.query(&mut plain(&self.url).expect("a plain connection")).expect("PTTL"),
        }
    }

    /// Deletes every key of this test, as FLUSHALL would the deployment's.
    pub fn forget_everything(&self) {
        delete_all(&self.url, self.keys.as_str()).expect("delete the test's keys");
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // A Redis gone meanwhile has nothing left to clean; the test says why it failed.
        let _ = delete_all(&self.url, self.keys.as_str());
    }
}

/// Deletes every key starting with `prefix`, as FLUSHALL would: on one server in one
/// `DEL`, so no other client sees some of the keys gone and others not; on a cluster
/// master by master, one `DEL` per hash tag (keys of different slots may not share a
/// command), so the keys one script touches (they share a tag) vanish together.
fn delete_all(url: &str, prefix: &str) -> redis::RedisResult<()> {
    let cluster = cluster_nodes(url).is_some();
    for node in masters(url)? {
        let mut redis = plain(&node)?;
        let keys = scan(&mut redis, prefix)?;
        if keys.is_empty() {
            continue;
        }
        let mut groups: HashMap<&str, Vec<&str>> = HashMap::new();
        for key in &keys {
            groups.entry(if cluster { hash_tag(key) } else { "" }).or_default().push(key);
        }
        let mut delete = redis::pipe();
        for group in groups.values() {
            delete.cmd("DEL").arg(group).ignore();
        }
        delete.query::<()>(&mut redis)?;
    }
    Ok(())
}

/// The part of `key` Redis Cluster hashes to pick its slot: the text inside the first
/// `{…}` if not empty, else the whole key.
fn hash_tag(key: &str) -> &str {
    key.split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(tag, _)| tag)
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key)
}

/// A plain connection to the one server at `url`.
fn plain(url: &str) -> redis::RedisResult<redis::Connection> {
    redis::Client::open(url)?.get_connection()
}

/// Every key starting with `prefix` (which holds no glob characters), on one server.
fn scan(redis: &mut redis::Connection, prefix: &str) -> redis::RedisResult<Vec<String>> {
    let (mut cursor, mut keys) = (0_u64, Vec::new());
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query(redis)?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// The userinfo (`user:password@`, or empty) and the node URLs (`redis://…`) of a
/// `redis+cluster://` URL; `None` for one server.
fn cluster_nodes(url: &str) -> Option<(String, Vec<String>)> {
    let rest = url.strip_prefix(CLUSTER_SCHEME)?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let (userinfo, hosts) =
        authority.rsplit_once('@').map_or((String::new(), authority), |(u, h)| (format!("{u}@"), h));
    let nodes =
        hosts.split(',').filter(|host| !host.is_empty()).map(|host| format!("redis://{userinfo}{host}")).collect();
    Some((userinfo, nodes))
}

/// The URL of each master (`url` itself for one server), from `CLUSTER NODES` of the first
/// node of the URL that answers.
fn masters(url: &str) -> redis::RedisResult<Vec<String>> {
    Ok(master_addresses(url)?.map_or_else(
        || vec![url.to_owned()],
        |(userinfo, addresses)| addresses.into_iter().map(|address| format!("redis://{userinfo}{address}")).collect(),
    ))
}

/// For a cluster URL: its userinfo and the `host:port` each master announces.
fn master_addresses(url: &str) -> redis::RedisResult<Option<(String, Vec<String>)>> {
    let Some((userinfo, nodes)) = cluster_nodes(url) else { return Ok(None) };
    let mut failure = None;
    for node in &nodes {
        let listing: String =
            match plain(node).and_then(|mut redis| redis::cmd("CLUSTER").arg("NODES").query(&mut redis)) {
                Ok(listing) => listing,
                Err(error) => {
                    failure = Some(error);
                    continue;
                }
            };
        // `<id> <ip:port@bus-port[,hostname]> <flags> …`, one line per node.
        let addresses = listing
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let (address, flags) = (fields.nth(1)?, fields.next()?);
                let live_master = flags.split(',').any(|flag| flag == "master")
                    && !flags.split(',').any(|flag| matches!(flag, "fail" | "noaddr" | "handshake"));
                live_master.then(|| address.split('@').next().unwrap_or(address).to_owned())
            })
            .collect();
        return Ok(Some((userinfo, addresses)));
    }
    Err(failure
        .unwrap_or_else(|| redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no node in the URL"))))
}

/// A TCP proxy to Redis that, while `cut`, passes nothing on in either direction (bytes
/// wait until it is not), as a network partition would; returns the URL to [`connect`]
/// through it. For a Redis Cluster, one proxy per master, all cut at once.
pub async fn partitionable_proxy(url: &str, cut: Arc<AtomicBool>) -> String {
    let cluster_url = url.to_owned();
    let cluster = tokio::task::spawn_blocking(move || master_addresses(&cluster_url))
        .await
        .expect("list the masters")
        .unwrap_or_else(|error| panic!("cannot list the masters of the Redis Cluster at {url}: {error}"));
    if let Some((userinfo, masters)) = cluster {
        let mut node_map = HashMap::new();
        for master in masters {
            let proxy = proxy_to(master.clone(), Arc::clone(&cut)).await;
            node_map.insert(master, proxy);
        }
        let first = node_map.values().next().expect("a cluster has a master").clone();
        let proxied = format!("{CLUSTER_SCHEME}{userinfo}{first}");
        PROXIED_CLUSTERS.lock().expect("proxy registry").insert(proxied.clone(), node_map);
        return proxied;
    }
    let (scheme, rest) = url.split_once("://").expect("a redis:// URL");
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let (userinfo, target) = authority.rsplit_once('@').map_or(("", authority), |(u, t)| (u, t));
    let address = proxy_to(target.to_owned(), cut).await;
    let at = if userinfo.is_empty() { String::new() } else { format!("{userinfo}@") };
    format!("{scheme}://{at}{address}/{path}")
}

/// Starts a proxy to `target` (`host:port`); returns the `host:port` it listens on.
pub async fn proxy_to(target: String, cut: Arc<AtomicBool>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
    let address = listener.local_addr().expect("proxy address");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&target).await else { continue };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(pass_on(client_read, server_write, Arc::clone(&cut)));
            tokio::spawn(pass_on(server_read, client_write, Arc::clone(&cut)));
        }
    });
    address.to_string()
}

/// Copies `from` to `to`, holding bytes while `cut`.
async fn pass_on(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    let mut buffer = vec![0; 16 * 1024];
    while let Ok(read @ 1..) = from.read(&mut buffer).await {
        while cut.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

#[test]
fn hash_tags_follow_redis_cluster_rules() {
    assert_eq!(hash_tag("test:1:node:{cluster}:leases"), "cluster");
    assert_eq!(hash_tag("test:1:route:{u:ann}"), "u:ann");
    assert_eq!(hash_tag("a{}b{c}"), "a{}b{c}", "an empty tag: the whole key");
    assert_eq!(hash_tag("plain"), "plain");
    assert_eq!(hash_tag("x{open"), "x{open");
}

/// A Redis server of one test's own (Debian's `redis-server`, on a free loopback port,
/// keeping nothing on disk), so that the test may kill and restart it: a restart is a new
/// process on the same port with no data. Killed on drop.
pub struct PrivateRedis {
    port: u16,
    process: Mutex<std::process::Child>,
}

impl PrivateRedis {
    /// Starts one and waits until it answers, or fails the test saying why.
    pub fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        Self { port, process: Mutex::new(Self::spawn(port)) }
    }

    /// `redis://` URL of this server.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `kill -9` of the server, then a new empty one on the same port.
    pub fn restart(&self) {
        let mut process = self.process.lock().expect("the server's process");
        let _ = process.kill();
        let _ = process.wait();
        *process = Self::spawn(self.port);
    }

    /// Every key starting with `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        scan(&mut plain(&self.url()).expect("a connection to the test's Redis"), prefix).expect("SCAN")
    }

    fn spawn(port: u16) -> std::process::Child {
        let port_arg = port.to_string();
        let process = std::process::Command::new("redis-server")
            .args(["--port", &port_arg, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot start redis-server ({error}); install Debian's redis-server (scripts/services.sh)")
            });
        let url = format!("redis://127.0.0.1:{port}/0");
        poll()
            .every(Duration::from_millis(20))
            .until_blocking(&format!("redis-server on port {port} to answer"), || {
                plain(&url).and_then(|mut redis| redis::cmd("PING").query::<String>(&mut redis))
            });
        process
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let process = self.process.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = process.kill();
        let _ = process.wait();
    }
}

//! What the tests of cluster mode's Redis parts share: the Redis to test against
//! (`HERALD_TEST_REDIS_URL`, or `redis://127.0.0.1:6379/0`), a corner of it per test (a
//! unique key prefix, its keys deleted on drop even when the test panics), and a proxy that
//! can cut Redis off as a partition would. A Redis that cannot be reached fails the test,
//! never skips it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use herald_host::cluster::{KeyPrefix, RedisConnection};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

pub fn redis_url() -> String {
    std::env::var("HERALD_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".to_owned())
}

/// Connects to `url` or fails the test saying how to get a Redis.
pub async fn connect(url: &str) -> RedisConnection {
    RedisConnection::connect(url, Duration::from_secs(3)).await.unwrap_or_else(|error| {
        panic!(
            "{error}. These tests need a real Redis: start one (redis-server --daemonize yes --port 6379 \
             --save '' --appendonly no) or set HERALD_TEST_REDIS_URL to one"
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
        let mut redis = self.plain_connection();
        scan(&mut redis, self.keys.as_str()).iter().map(|key| key[self.keys.as_str().len()..].to_owned()).collect()
    }

    /// The TTL of one of this test's keys, in ms (-1: none, -2: no such key).
    pub fn ttl_ms(&self, key: &str) -> i64 {
        let mut redis = self.plain_connection();
        redis::cmd("PTTL").arg(format!("{}{key}", self.keys.as_str())).query(&mut redis).expect("PTTL")
    }

    /// Deletes every key of this test, as FLUSHALL would the deployment's.
    pub fn forget_everything(&self) {
        let mut redis = self.plain_connection();
        let keys = scan(&mut redis, self.keys.as_str());
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL").arg(keys).query(&mut redis).expect("DEL");
        }
    }

    fn plain_connection(&self) -> redis::Connection {
        redis::Client::open(self.url.as_str()).and_then(|client| client.get_connection()).expect("a plain connection")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Ok(mut redis) = redis::Client::open(self.url.as_str()).and_then(|client| client.get_connection()) else {
            return;
        };
        for chunk in scan(&mut redis, self.keys.as_str()).chunks(500) {
            let _: Result<(), _> = redis::cmd("DEL").arg(chunk).query(&mut redis);
        }
    }
}

/// Every key starting with `prefix` (which holds no glob characters).
fn scan(redis: &mut redis::Connection, prefix: &str) -> Vec<String> {
    let (mut cursor, mut keys) = (0_u64, Vec::new());
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query(redis)
            .expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// A TCP proxy to Redis that, while `cut`, passes nothing on in either direction (bytes
/// wait until it is not), as a network partition would; returns the URL to connect
/// through it.
pub async fn partitionable_proxy(url: &str, cut: Arc<AtomicBool>) -> String {
    let (scheme, rest) = url.split_once("://").expect("a redis:// URL");
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let (userinfo, target) = authority.rsplit_once('@').map_or(("", authority), |(u, t)| (u, t));
    let target = target.to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
    let address = listener.local_addr().expect("proxy address");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&target).await else { return };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(pass_on(client_read, server_write, Arc::clone(&cut)));
            tokio::spawn(pass_on(server_read, client_write, Arc::clone(&cut)));
        }
    });
    let at = if userinfo.is_empty() { String::new() } else { format!("{userinfo}@") };
    format!("{scheme}://{at}{address}/{path}")
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

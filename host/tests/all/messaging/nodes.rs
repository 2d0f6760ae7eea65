//! A cluster of real `herald serve --dev` processes for the tests of cluster mode: N nodes
//! on loopback sharing a fresh database (PostgreSQL or MariaDB) and a corner of the local
//! Redis (a key prefix of their own, deleted at the end), node-to-node links on ports the
//! system picks. Plus the history checker the fault tests share.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use herald_host::config::StorageConfig;
use herald_host::store::{Backend, Database};
use herald_proto::v1;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::rustls::ClientConfig;

use super::WAIT;
use super::client::Client;
use super::server::{DEV_KEY, Herald, Options};
use crate::redis_scratch::Scratch;
use crate::support::poll::poll;
use crate::support::scratch::ScratchDatabase;

/// Lease TTL of the test nodes: short, so a dead node's conversations move quickly.
pub const LEASE_TTL_MS: u64 = 1_500;

/// N nodes of one cluster.
pub struct Nodes {
    pub nodes: Vec<Herald>,
    /// The shared database, dropped at the end.
    database: Option<ScratchDatabase>,
    /// The shared Redis corner.
    pub redis: Scratch,
    extra: Vec<(String, String)>,
    /// The nodes speak TLS (`[tls]` among `extra`): the harness connects with this.
    tls: Option<Arc<ClientConfig>>,
    /// Nodes killed or stopped (SIGSTOP): not asked anything.
    down: BTreeSet<usize>,
}

impl Nodes {
    /// Starts `count` nodes on a fresh database of `backend` and waits until each sees all.
    pub async fn start(count: usize, backend: Backend) -> Self {
        Self::start_with(count, backend, &[]).await
    }

    /// As [`start`](Self::start), with extra `HERALD_*` settings (`("GATEWAY__HEARTBEAT_MS", "200")`).
    pub async fn start_with(count: usize, backend: Backend, extra: &[(&str, &str)]) -> Self {
        Self::start_configured(count, backend, extra, None).await
    }

    /// As [`start_with`](Self::start_with), the harness connecting over TLS with `tls`.
    pub async fn start_configured(
        count: usize,
        backend: Backend,
        extra: &[(&str, &str)],
        tls: Option<Arc<ClientConfig>>,
    ) -> Self {
        let database = ScratchDatabase::create(backend, "herald_c").await.unwrap_or_else(|error| panic!("{error}"));
        let redis = Scratch::new().await;
        let extra = extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let mut nodes = Self { nodes: Vec::new(), database: Some(database), redis, extra, tls, down: BTreeSet::new() };
        for _ in 0..count {
            let node = nodes.options().start().await;
            nodes.nodes.push(node);
        }
        nodes.wait_for_members(count).await;
        nodes
    }

    /// As [`start_with`](Self::start_with), every node's links from the others passing
    /// through a proxy of its own that breaks them all while `broken` holds (each side sees
    /// the other close) and refuses new ones meanwhile, as a failing switch would.
    pub async fn start_with_breakable_links(
        count: usize,
        backend: Backend,
        extra: &[(&str, &str)],
        broken: &watch::Receiver<bool>,
    ) -> Self {
        let mut nodes = Self::start_configured(0, backend, extra, None).await;
        for _ in 0..count {
            // The node takes a port of the system's choosing for its links; its proxy learns
            // which from `/admin/cluster` (a link dialled before then waits for it).
            let (target, learned) = watch::channel(None);
            let proxy = breakable_proxy_to(learned, broken.clone()).await;
            let node = nodes.options().set("CLUSTER__ADVERTISE", proxy).start().await;
            let cluster = node.get("/admin/cluster", Some(DEV_KEY)).await.json();
            let peer_listen = cluster["lease"]["peer_listen"].as_str().expect("the bound peer_listen").to_owned();
            target.send_replace(Some(peer_listen));
            nodes.nodes.push(node);
        }
        nodes.wait_for_members(count).await;
        nodes
    }

    /// The settings of every node of this cluster.
    pub fn options(&self) -> Options {
        let database = self.database.as_ref().expect("the database lives as long as the nodes");
        let mut options = Herald::with()
            .set("CLUSTER__REDIS_URL", &self.redis.url)
            .set("CLUSTER__KEY_PREFIX", self.redis.keys.as_str())
            .set("CLUSTER__PEER_LISTEN", "127.0.0.1:0")
            .set("CLUSTER__LEASE_TTL_MS", LEASE_TTL_MS)
            .set("STORAGE__URL", &database.url);
        for (key, value) in &self.extra {
            options = options.set(key, value);
        }
        if let Some(tls) = &self.tls {
            options = options.tls(Arc::clone(tls));
        }
        options
    }

    /// `GET /admin/cluster` of node `at`.
    pub async fn cluster_of(&self, at: usize) -> serde_json::Value {
        let response = self.nodes[at].get("/admin/cluster", Some(DEV_KEY)).await;
        assert_eq!(response.status, 200, "GET /admin/cluster: {response:?}");
        response.json()
    }

    /// The node id of node `at`.
    pub async fn node_id(&self, at: usize) -> u64 {
        self.cluster_of(at).await["this_node"].as_u64().expect("this_node")
    }

    /// `kill -9` of node `at`.
    pub fn kill9(&mut self, at: usize) {
        self.nodes[at].kill9();
        self.down.insert(at);
    }

    /// SIGTERM of node `at`, as a service manager stops it: it drains (`go_away` to every
    /// client), leaves the cluster and exits; waits for that and checks it exited cleanly.
    pub async fn terminate(&mut self, at: usize) {
        let clean = self.nodes[at].terminate().await;
        assert!(clean, "node {at} exits cleanly on SIGTERM\n{}", self.nodes[at].log_tail());
        self.down.insert(at);
    }

    /// SIGSTOP of node `at`: it stops dead, holding its sockets, as a paused VM would.
    pub fn pause(&mut self, at: usize) {
        self.nodes[at].signal("STOP");
        self.down.insert(at);
    }

    /// SIGCONT of a paused node `at`; it is still not asked anything (it may be on its way out).
    pub fn resume(&mut self, at: usize) {
        self.nodes[at].signal("CONT");
    }

    /// Starts node `at` again (a new process, the same data dir) and asks it again.
    pub async fn restart(&mut self, at: usize) {
        self.nodes[at].restart().await;
        self.down.remove(&at);
    }

    /// Starts node `at` again at the same address (port), as behind nginx.
    pub async fn restart_in_place(&mut self, at: usize) {
        self.nodes[at].restart_in_place().await;
        self.down.remove(&at);
    }

    /// Starts one more node of this cluster and waits until every node up sees it; returns
    /// its index.
    pub async fn add(&mut self) -> usize {
        let node = self.options().start().await;
        self.nodes.push(node);
        self.wait_for_members(self.up().len()).await;
        self.nodes.len() - 1
    }

    /// The sum over the nodes up of the Prometheus sample `series`.
    pub async fn total(&self, series: &str) -> f64 {
        let mut sum = 0.0;
        for at in self.up() {
            sum += self.nodes[at].metric(series).await;
        }
        sum
    }

    /// Whether no node up has a backfill under way.
    pub async fn backfills_over(&self) -> bool {
        for at in self.up() {
            if !self.nodes[at].backfills_over().await {
                return false;
            }
        }
        true
    }

    /// The nodes up (neither killed nor paused).
    pub fn up(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|at| !self.down.contains(at)).collect()
    }

    /// Waits until every node that is up sees `count` members on its ring.
    pub async fn wait_for_members(&self, count: usize) {
        self.wait_until(&format!("every node to see {count} members"), async || {
            for at in self.up() {
                let cluster = self.cluster_of(at).await;
                if cluster["nodes"].as_array().map(Vec::len) != Some(count) {
                    return false;
                }
            }
            true
        })
        .await;
    }

    /// Polls `done` every 50 ms until it holds, for at most [`WAIT`] (plus a lease TTL).
    pub async fn wait_until(&self, what: &str, done: impl AsyncFnMut() -> bool) {
        let patient = poll().within(WAIT + Duration::from_millis(LEASE_TTL_MS)).every(Duration::from_millis(50));
        if let Err(timed_out) = patient.try_until(what, done).await {
            panic!("{timed_out}\n{}", self.log_tails());
        }
    }

    /// The index of the node owning a send of `user` to `conversation`, as node `asked` sees it
    /// (every node that is up is asked its id).
    pub async fn owner_of(&self, asked: usize, user: &str, conversation: &str) -> usize {
        let path = format!("/admin/route?user={user}&conversation={conversation}");
        let response = self.nodes[asked].get(&path, Some(DEV_KEY)).await;
        assert_eq!(response.status, 200, "GET {path}: {response:?}");
        let owner = response.json()["owner"].as_u64().expect("an owner");
        for at in self.up() {
            if self.node_id(at).await == owner {
                return at;
            }
        }
        panic!("owner {owner} of {conversation} is none of the nodes")
    }

    /// The shared database, opened directly (to stage what an earlier cluster left in it).
    pub async fn database(&self) -> Database {
        let url = &self.database.as_ref().expect("the database lives as long as the nodes").url;
        Database::connect(url, &StorageConfig::default()).await.expect("connect to the cluster's database")
    }

    /// The last log lines of every node.
    pub fn log_tails(&self) -> String {
        self.nodes.iter().enumerate().map(|(at, node)| format!("node {at}:\n{}\n", node.log_tail())).collect()
    }

    /// Stops every node and drops the database.
    pub async fn stop(mut self) {
        for node in &mut self.nodes {
            node.kill9();
        }
        if let Some(database) = self.database.take() {
            database.drop_database().await.expect("drop the test database");
        }
    }
}

/// Starts a TCP proxy to the `host:port` `target` holds once it is known, that closes every
/// connection it carries the moment `broken` holds, and closes each one it accepts
/// meanwhile; returns the `host:port` it listens on.
async fn breakable_proxy_to(mut target: watch::Receiver<Option<String>>, broken: watch::Receiver<bool>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
    let address = listener.local_addr().expect("proxy address");
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            if *broken.borrow() {
                continue;
            }
            let to = loop {
                if let Some(to) = target.borrow_and_update().clone() {
                    break to;
                }
                if target.changed().await.is_err() {
                    return;
                }
            };
            let Ok(mut server) = TcpStream::connect(&to).await else { continue };
            let mut broken = broken.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    _ = broken.wait_for(|broken| *broken) => {}
                }
            });
        }
    });
    address.to_string()
}

/// What the history checker knows of one conversation: every message a sender heard OK
/// for, and every `complete_through_seq` a reader was told.
#[derive(Debug, Default)]
pub struct History {
    /// conversation → (message id → seq), from OK acks.
    acked: BTreeMap<String, BTreeMap<u64, u64>>,
}

impl History {
    /// Notes an ack; only OK acks (and duplicates, which name the original) promise anything.
    pub fn record(&mut self, ack: &v1::SendAck) {
        if matches!(ack.status(), v1::send_ack::Status::Ok | v1::send_ack::Status::Duplicate) {
            let known = self.acked.entry(ack.conversation.clone()).or_default().insert(ack.message_id, ack.seq);
            assert!(known.is_none_or(|seq| seq == ack.seq), "message {} acked with two seqs", ack.message_id);
        }
    }

    /// How many OK acks were recorded.
    pub fn acked(&self) -> usize {
        self.acked.values().map(BTreeMap::len).sum()
    }

    /// Checks a conversation's stored history, as a reader pulled it in full: every OK-acked
    /// message appears exactly once with the seq its ack named, and seqs strictly increase.
    pub fn check(&self, conversation: &str, stored: &[v1::Message]) {
        let mut seen = BTreeSet::new();
        let mut last = 0;
        for message in stored {
            assert!(message.seq > last, "{conversation}: seq {} after {last}: not strictly increasing", message.seq);
            last = message.seq;
            assert!(seen.insert(message.id), "{conversation}: message {} stored twice", message.id);
        }
        let by_id: BTreeMap<u64, u64> = stored.iter().map(|m| (m.id, m.seq)).collect();
        for (id, seq) in self.acked.get(conversation).into_iter().flatten() {
            match by_id.get(id) {
                Some(stored_seq) => {
                    assert_eq!(
                        stored_seq, seq,
                        "{conversation}: message {id} acked with seq {seq}, stored at {stored_seq}"
                    );
                }
                None => panic!("{conversation}: message {id} (seq {seq}) was acked OK but is not stored"),
            }
        }
    }
}

/// Pulls a conversation's whole history through `reader` and checks it; returns it.
pub async fn check_history(history: &History, reader: &mut Client, conversation: &str) -> Vec<v1::Message> {
    let stored = reader.whole_history(conversation).await;
    history.check(conversation, &stored);
    stored
}

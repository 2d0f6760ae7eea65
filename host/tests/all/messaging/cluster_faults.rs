//! Cluster mode under faults, each checked by the history checker ([`History`]): every
//! OK-acked message stored exactly once at the seq its ack named, seqs strictly increasing
//! per conversation, nothing appearing below what a reader already saw, and every device
//! ending with every message.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use herald_host::routing::ring::{DEFAULT_VIRTUAL_NODES, Ring};
use herald_host::store::{Backend, Pool};
use herald_proto::v1::{self, frame::Body, send_ack::Status};
use tokio::sync::watch;

use super::client::Client;
use super::nodes::{History, LEASE_TTL_MS, Nodes, check_history};
use super::{dm, metric, uuid};
use crate::redis_scratch::{PrivateRedis, partitionable_proxy, redis_url};
use crate::support::poll::poll;

/// How long a send may take to be accepted once its owner is gone: the lease lapsing, the
/// ring moving, a pending dedup mark of the dead owner expiring.
const SETTLE: Duration = Duration::from_secs(60);

/// A user sending from one node, moving to another when its node is gone.
struct Writer {
    user: String,
    at: usize,
    client: Option<Client>,
}

impl Writer {
    async fn connect(nodes: &Nodes, user: &str, at: usize) -> Self {
        let client = Client::connect(&nodes.nodes[at], user, "writer").await;
        Self { user: user.to_owned(), at, client: Some(client) }
    }

    /// Sends without waiting.
    async fn send(&mut self, id: &str, conversation: &str) {
        let client = self.client.as_mut().expect("connected");
        client.send_with(id, conversation, 1, id.as_bytes()).await;
    }

    /// The ack of `id` if one comes within `wait` on this connection.
    async fn ack(&mut self, id: &str, wait: Duration) -> Option<v1::SendAck> {
        let client = self.client.as_mut()?;
        client
            .try_wait_for(wait, |frame| match &frame.body {
                Some(Body::SendAck(ack)) if ack.client_msg_id == id => Some(ack.clone()),
                _ => None,
            })
            .await
            .ok()
    }

    /// Sends `id` (again) until it is OK, moving to a node that is up when this one is not.
    async fn until_ok(&mut self, nodes: &Nodes, id: &str, conversation: &str) -> v1::SendAck {
        let deadline = Instant::now() + SETTLE;
        loop {
            if let Some(ack) = self.ack(id, Duration::from_secs(3)).await {
                match ack.status() {
                    // A duplicate answers with the original's ids: as good as OK.
                    Status::Ok | Status::Duplicate => return ack,
                    Status::Retry => {}
                    Status::Rejected | Status::Unspecified => panic!("{id} not accepted: {ack:?}"),
                }
            } else if !nodes.up().contains(&self.at) || self.client.is_none() {
                let up = nodes.up();
                self.at = up[self.user.len() % up.len()];
                self.client = Some(Client::connect(&nodes.nodes[self.at], &self.user, "writer").await);
            }
            assert!(
                Instant::now() < deadline,
                "{id} to {conversation} not accepted within {SETTLE:?}\n{}",
                nodes.log_tails()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.send(id, conversation).await;
        }
    }
}

/// Writers on every node, each with a dm to a reader; `owner_killed` owns some of them.
async fn writers(nodes: &Nodes, count: usize) -> Vec<(Writer, String, String)> {
    writers_of(nodes, (0..count).map(|n| (format!("w{n}"), format!("r{n}")))).await
}

/// A writer for each (user, reader) pair, on the nodes in turn, with their dm.
async fn writers_of(nodes: &Nodes, pairs: impl IntoIterator<Item = (String, String)>) -> Vec<(Writer, String, String)> {
    let mut writers = Vec::new();
    for (n, (user, reader)) in pairs.into_iter().enumerate() {
        let writer = Writer::connect(nodes, &user, n % nodes.nodes.len()).await;
        writers.push((writer, dm(&user, &reader), reader));
    }
    writers
}

/// Sends `per_writer` messages from every writer without waiting, runs `fault`, then sends
/// each again until OK and records the acks.
async fn traffic_through(
    nodes: &mut Nodes,
    writers: &mut [(Writer, String, String)],
    per_writer: usize,
    history: &mut History,
    fault: impl AsyncFnOnce(&mut Nodes),
) {
    let mut sent = Vec::new();
    for (index, (writer, conversation, _)) in writers.iter_mut().enumerate() {
        for _ in 0..per_writer {
            let id = uuid();
            writer.send(&id, conversation).await;
            sent.push((index, id));
        }
    }
    fault(nodes).await;
    for (index, id) in sent {
        let (writer, conversation, _) = &mut writers[index];
        let ack = writer.until_ok(nodes, &id, conversation).await;
        history.record(&ack);
    }
}

/// Every reader, connected to a node that is up, pulls its conversation and checks it.
async fn every_reader_has_everything(nodes: &Nodes, writers: &[(Writer, String, String)], history: &History) {
    let up = nodes.up();
    for (n, (_, conversation, reader)) in writers.iter().enumerate() {
        let mut client = Client::connect(&nodes.nodes[up[n % up.len()]], reader, "phone").await;
        let stored = check_history(history, &mut client, conversation).await;
        assert!(!stored.is_empty(), "{conversation} has messages");
        client.close().await;
    }
}

async fn kill9_of_a_node_mid_traffic(backend: Backend) {
    let mut nodes = Nodes::start(3, backend).await;
    let mut writers = writers(&nodes, 6).await;
    let mut history = History::default();
    traffic_through(&mut nodes, &mut writers, 5, &mut history, async |_| {}).await;
    traffic_through(&mut nodes, &mut writers, 10, &mut history, async |nodes: &mut Nodes| nodes.kill9(2)).await;
    nodes.wait_for_members(2).await;
    // After the ring moved, more traffic on the two survivors.
    traffic_through(&mut nodes, &mut writers, 5, &mut history, async |_| {}).await;
    assert_eq!(history.acked(), 6 * 20);
    every_reader_has_everything(&nodes, &writers, &history).await;

    // The dead node comes back (same data dir, a new process) and takes part again.
    nodes.nodes[2].restart().await;
    nodes.wait_for_members(3).await;
    traffic_through(&mut nodes, &mut writers, 2, &mut history, async |_| {}).await;
    every_reader_has_everything(&nodes, &writers, &history).await;
    nodes.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_a_node_mid_traffic_loses_nothing_on_postgres() {
    kill9_of_a_node_mid_traffic(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_a_node_mid_traffic_loses_nothing_on_mariadb() {
    kill9_of_a_node_mid_traffic(Backend::MySql).await;
}

/// A fourth node (its id pinned, so the test knows the ring it makes) joins mid-traffic:
/// the conversations the ring gives it move to it, its sends are stored there above
/// everything stored before, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_mid_traffic_takes_over_its_share_and_loses_nothing() {
    const NEW_NODE: u32 = 900;
    let mut nodes = Nodes::start(3, Backend::Postgres).await;
    let mut ids = vec![nodes.node_id(0).await, nodes.node_id(1).await, nodes.node_id(2).await];
    ids.push(u64::from(NEW_NODE));
    let ids: Vec<u32> = ids.into_iter().map(|id| u32::try_from(id).expect("a node id")).collect();
    let after = Ring::new(&ids, DEFAULT_VIRTUAL_NODES);
    // Four conversations the new node takes over and four it does not.
    let (mut moving, mut staying) = (Vec::new(), Vec::new());
    for n in 0.. {
        let (user, reader) = (format!("j{n}"), format!("k{n}"));
        let conversation = dm(&user, &reader);
        let list = if after.owner(&conversation) == Some(NEW_NODE) { &mut moving } else { &mut staying };
        if list.len() < 4 {
            list.push((user, conversation, reader));
        }
        if moving.len() == 4 && staying.len() == 4 {
            break;
        }
    }
    let pairs = moving.iter().chain(&staying).map(|(user, _, reader)| (user.clone(), reader.clone()));
    let mut writers = writers_of(&nodes, pairs).await;
    let mut history = History::default();
    traffic_through(&mut nodes, &mut writers, 5, &mut history, async |_| {}).await;
    traffic_through(&mut nodes, &mut writers, 5, &mut history, async |nodes: &mut Nodes| {
        let joining = nodes.options().set("NODE_ID", NEW_NODE).start().await;
        nodes.nodes.push(joining);
    })
    .await;
    nodes.wait_for_members(4).await;
    traffic_through(&mut nodes, &mut writers, 5, &mut history, async |_| {}).await;
    assert_eq!(history.acked(), 8 * 15);

    for (user, conversation, _) in &moving {
        let route = nodes.nodes[0]
            .get(&format!("/admin/route?user={user}&conversation={conversation}"), Some(super::server::DEV_KEY))
            .await
            .json();
        assert_eq!(route["owner"], NEW_NODE, "{conversation}: {route}");
    }
    let stored_there = nodes.nodes[3].get("/metrics", None).await.body;
    let stored: f64 = stored_there
        .lines()
        .find_map(|line| line.strip_prefix("herald_pipeline_messages_stored_total "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(stored >= 4.0 * 5.0, "the new node stored its conversations' sends as their owner: {stored}");
    every_reader_has_everything(&nodes, &writers, &history).await;
    nodes.stop().await;
}

/// SIGSTOP of the owner of a conversation for longer than its lease: another node takes
/// the conversation over; after SIGCONT the paused node must not commit anything as its
/// owner (nothing appears below what readers already saw), and it stops by itself.
async fn a_paused_owner_resumed_after_its_lease_lapsed_commits_nothing(backend: Backend) {
    let mut nodes = Nodes::start(3, backend).await;
    let mut writers = writers(&nodes, 6).await;
    let mut history = History::default();
    traffic_through(&mut nodes, &mut writers, 3, &mut history, async |_| {}).await;
    // The writers of node 2 move now, so that only the owner's role is paused.
    for (writer, _, _) in &mut writers {
        if writer.at == 2 {
            *writer = Writer::connect(&nodes, &writer.user.clone(), 0).await;
        }
    }
    traffic_through(&mut nodes, &mut writers, 5, &mut history, async |nodes: &mut Nodes| {
        nodes.pause(2);
    })
    .await;
    nodes.wait_for_members(2).await;
    // What readers see now is the past: nothing may appear in it later.
    let mut seen = Vec::new();
    let up = nodes.up();
    for (n, (_, conversation, reader)) in writers.iter().enumerate() {
        let mut client = Client::connect(&nodes.nodes[up[n % up.len()]], reader, "phone").await;
        seen.push(check_history(&history, &mut client, conversation).await);
        client.close().await;
    }

    nodes.resume(2);
    // The zombie learns its lease is gone at its next renew and stops; meanwhile whatever
    // it had in flight must be refused by the fence.
    let stopping = poll().within(Duration::from_millis(LEASE_TTL_MS * 10)).every(Duration::from_millis(100));
    if let Err(timed_out) = stopping.try_until("the resumed node to stop", async || !nodes.nodes[2].is_running()).await
    {
        panic!("{timed_out}\n{}", nodes.nodes[2].log_tail());
    }
    assert!(nodes.nodes[2].log_tail().contains("lease lost"), "{}", nodes.nodes[2].log_tail());
    traffic_through(&mut nodes, &mut writers, 3, &mut history, async |_| {}).await;
    for (n, (_, conversation, reader)) in writers.iter().enumerate() {
        let mut client = Client::connect(&nodes.nodes[up[n % up.len()]], reader, "phone").await;
        let now = check_history(&history, &mut client, conversation).await;
        let last_seen = seen[n].last().map_or(0, |m| m.seq);
        let past: Vec<u64> = now.iter().filter(|m| m.seq <= last_seen).map(|m| m.id).collect();
        let before: Vec<u64> = seen[n].iter().map(|m| m.id).collect();
        assert_eq!(past, before, "{conversation}: a message appeared at or below seq {last_seen} after readers saw it");
        client.close().await;
    }
    nodes.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_resumed_after_its_lease_lapsed_commits_nothing_on_postgres() {
    a_paused_owner_resumed_after_its_lease_lapsed_commits_nothing(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_resumed_after_its_lease_lapsed_commits_nothing_on_mariadb() {
    a_paused_owner_resumed_after_its_lease_lapsed_commits_nothing(Backend::MySql).await;
}

/// Redis loses its data mid-traffic (`lose`): the nodes re-assert their leases, routes and
/// rooms (`routes_written` counts the readers' routes back in Redis), traffic goes on with
/// nothing lost, and what is sent once the routes are back is pushed live to readers that
/// stayed connected throughout.
async fn redis_data_lost_mid_traffic(
    mut nodes: Nodes,
    lose: impl AsyncFnOnce(&mut Nodes),
    routes_written: impl Fn(&Nodes) -> usize,
) {
    let mut writers = writers(&nodes, 6).await;
    let mut history = History::default();
    let mut readers = Vec::new();
    for (n, (_, conversation, reader)) in writers.iter().enumerate() {
        readers.push((Client::connect(&nodes.nodes[(n + 1) % 3], reader, "live").await, conversation.clone()));
    }
    traffic_through(&mut nodes, &mut writers, 5, &mut history, lose).await;
    nodes.wait_until("the routes to be written again", async || routes_written(&nodes) == 6).await;
    nodes.wait_for_members(3).await;
    let acked_before = history.acked();
    traffic_through(&mut nodes, &mut writers, 5, &mut history, async |_| {}).await;
    for (reader, conversation) in &mut readers {
        let stored = reader.whole_history(conversation).await;
        history.check(conversation, &stored);
        let last = stored.last().expect("messages").id;
        let pushed = reader
            .try_wait_for(super::WAIT, |frame| match &frame.body {
                Some(Body::Deliver(deliver)) if deliver.message.as_ref().is_some_and(|m| m.id == last) => Some(()),
                _ => None,
            })
            .await;
        assert!(
            pushed.is_ok(),
            "{}\n{}",
            reader.failure(&format!("no push of {last} in {conversation}")),
            nodes.log_tails()
        );
    }
    assert!(history.acked() > acked_before);
    every_reader_has_everything(&nodes, &writers, &history).await;
    nodes.stop().await;
}

/// The whole cluster stops, Redis loses its data meanwhile, and the nodes start again. The
/// earlier cluster had counted ring epochs to 500 and node 9 owned the conversation; Redis
/// now counts from nothing, but the new owner must still take the conversation over (at an
/// epoch above 500, from the database) and store above every seq handed out before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_restart_on_an_emptied_redis_serves_conversations_owned_at_a_higher_epoch() {
    let mut nodes = Nodes::start(2, Backend::Postgres).await;
    let conversation = dm("ada", "bea");
    let before = Client::connect(&nodes.nodes[0], "ada", "laptop").await.send_ok(&conversation, "before").await;
    for at in 0..2 {
        nodes.kill9(at);
    }
    nodes.redis.forget_everything();
    let database = nodes.database().await;
    let Pool::Postgres(pool) = &database.writer else { unreachable!("a PostgreSQL cluster") };
    let staged = sqlx::query("UPDATE session_seq SET owner_node = 9, owner_epoch = 500 WHERE conversation = $1")
        .bind(&conversation)
        .execute(pool)
        .await
        .expect("stage the earlier owner");
    assert_eq!(staged.rows_affected(), 1, "the conversation has a session_seq row");
    database.close().await;
    for at in 0..2 {
        nodes.restart(at).await;
    }
    nodes.wait_for_members(2).await;
    let mut sender = Client::connect(&nodes.nodes[1], "ada", "laptop").await;
    let after = sender.send_ok(&conversation, "after").await;
    assert!(after.seq > before.seq, "stored above what was handed out before: {} then {}", before.seq, after.seq);
    let epoch = nodes.cluster_of(0).await["epoch"].as_u64().expect("an epoch");
    assert!(epoch > 500, "the ring counts on from the database's owner epochs: {epoch}");
    nodes.stop().await;
}

/// Redis forgets everything mid-traffic (FLUSHALL of this deployment's keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_losing_its_data_mid_traffic_loses_nothing() {
    let nodes = Nodes::start(3, Backend::Postgres).await;
    let routes = |nodes: &Nodes| nodes.redis.keys_written().iter().filter(|key| key.starts_with("route:{u:r")).count();
    redis_data_lost_mid_traffic(nodes, async |nodes: &mut Nodes| nodes.redis.forget_everything(), routes).await;
}

/// Redis restarts mid-traffic: its process killed, a new one started on its port with
/// nothing in it. The nodes' connections break and come back, on MariaDB this time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_mid_traffic_loses_nothing() {
    let redis = PrivateRedis::start();
    let url = redis.url();
    let nodes = Nodes::start_with(3, Backend::MySql, &[("CLUSTER__REDIS_URL", url.as_str())]).await;
    let routes = |nodes: &Nodes| redis.keys(&format!("{}route:{{u:r", nodes.redis.keys.as_str())).len();
    redis_data_lost_mid_traffic(nodes, async |_: &mut Nodes| redis.restart(), routes).await;
}

/// The URL of a proxy to the test Redis for nodes to use, and the switch that cuts them
/// off from it.
async fn redis_to_cut_off() -> (String, Arc<AtomicBool>) {
    // A node dials the masters of a Redis Cluster at the addresses they announce, around any
    // proxy: it cannot be cut off this way. scripts/test.sh runs these tests on one Redis.
    assert!(
        !redis_url().starts_with("redis+cluster://"),
        "this test cuts nodes off from Redis through a proxy, which a Redis Cluster's own addresses bypass; \
         run it against one Redis (HERALD_TEST_REDIS_URL=redis://…)"
    );
    let cut = Arc::new(AtomicBool::new(false));
    (partitionable_proxy(&redis_url(), Arc::clone(&cut)).await, cut)
}

/// A node cut off from Redis keeps storing and acking sends (a dedup mark it cannot take
/// leaves duplicates to the unique index), opens its breaker on Redis and says so in
/// `/readyz` and `/metrics`, and closes it once Redis answers again; what it stored
/// meanwhile reaches the recipient.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_redis_keeps_acking_sends_and_says_so_until_redis_answers_again() {
    let (proxied, cut) = redis_to_cut_off().await;
    let nodes = Nodes::start_with(
        1,
        Backend::Postgres,
        &[
            ("CLUSTER__REDIS_URL", proxied.as_str()),
            // The lease outlives the cut, so /readyz shows the breaker rather than the fence.
            ("CLUSTER__LEASE_TTL_MS", "60000"),
            ("CLUSTER__BREAKER_FAILURES", "3"),
            ("CLUSTER__BREAKER_SPAN_MS", "0"),
            ("CLUSTER__BREAKER_OPEN_MS", "2000"),
        ],
    )
    .await;
    let node = &nodes.nodes[0];
    let mut ann = Client::connect(node, "ann", "phone").await;
    assert_eq!(node.get("/readyz", None).await.status, 200);
    let breaker_open =
        async || node.get("/metrics", None).await.body.contains("herald_breaker_state{breaker=\"redis\"} 2");
    assert!(!breaker_open().await);

    cut.store(true, Ordering::SeqCst);
    let mut stored = Vec::new();
    for n in 0..5 {
        stored.push(ann.send_ok(&dm("ann", "bob"), format!("while Redis is cut off {n}")).await.message_id);
    }
    let readyz = node.get("/readyz", None).await;
    assert_eq!(readyz.status, 503, "{readyz:?}");
    assert_eq!(readyz.json()["error"]["code"], "redis_unavailable", "{readyz:?}");
    assert!(breaker_open().await, "{}", node.get("/metrics", None).await.body);

    cut.store(false, Ordering::SeqCst);
    nodes
        .wait_until("the breaker to close once Redis answers", async || {
            stored.push(ann.send_ok(&dm("ann", "bob"), "Redis is back").await.message_id);
            node.get("/readyz", None).await.status == 200
        })
        .await;
    assert!(!breaker_open().await);
    let mut bob = Client::connect(node, "bob", "phone").await;
    for id in stored {
        bob.deliver_of(id).await;
    }
    nodes.stop().await;
}

/// Nodes cut off from Redis cannot read the route table or the room directory, yet a
/// message still reaches a connected device on another node at once: the owner asks every
/// node to push it to whichever recipients it holds (a lookup counted the device as offline,
/// so it got the message only at its next sync, which a live connection never makes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_redis_still_pushes_to_devices_on_other_nodes() {
    let (proxied, cut) = redis_to_cut_off().await;
    let nodes = Nodes::start_with(
        2,
        Backend::Postgres,
        &[
            ("CLUSTER__REDIS_URL", proxied.as_str()),
            // The leases outlive the cut: the owner keeps acting as one.
            ("CLUSTER__LEASE_TTL_MS", "60000"),
        ],
    )
    .await;
    let conversation = dm("ann", "bob");
    // bob is on the node that does not own the conversation: only a push from the owner
    // over the bus reaches him.
    let owner = nodes.owner_of(0, "ann", &conversation).await;
    let (ann_at, bob_at) = (owner, 1 - owner);
    let mut ann = Client::connect(&nodes.nodes[ann_at], "ann", "phone").await;
    let mut bob = Client::connect(&nodes.nodes[bob_at], "bob", "phone").await;
    let room = "room:lobby";
    ann.subscribe(room, None).await;
    bob.subscribe(room, None).await;

    cut.store(true, Ordering::SeqCst);
    for n in 0..3 {
        let ack = ann.send_ok(&conversation, format!("while Redis is cut off {n}")).await;
        let pushed = bob.deliver_of(ack.message_id).await;
        assert_eq!(pushed.message.map(|m| m.seq), Some(ack.seq), "pushed to bob at the seq ann was told");
    }
    let ack = ann.send_ok(room, "to the room while Redis is cut off").await;
    let pushed = bob.deliver_of(ack.message_id).await;
    assert_eq!(
        pushed.message.map(|m| m.conversation),
        Some(room.to_owned()),
        "the room's subscriber on the other node"
    );

    cut.store(false, Ordering::SeqCst);
    nodes.stop().await;
}

/// A delivery hop that fails because the link to the recipient's node broke is asked again
/// once the link is back: bob, connected to that node all along, gets every message live.
/// (Asked once only, he would have got them at his next sync, which a live connection never
/// makes.) So is a room message's hop to a node with subscribers: carol, subscribed there,
/// gets it live too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_whose_link_broke_reaches_the_device_once_the_link_is_back() {
    let (breaking, broken) = watch::channel(false);
    let nodes = Nodes::start_with_breakable_links(2, Backend::Postgres, &[], &broken).await;
    let conversation = dm("ann", "bob");
    // bob is on the node that does not own the conversation: only a hop from the owner
    // reaches him.
    let owner = nodes.owner_of(0, "ann", &conversation).await;
    let (ann_at, bob_at) = (owner, 1 - owner);
    let mut ann = Client::connect(&nodes.nodes[ann_at], "ann", "phone").await;
    let mut bob = Client::connect(&nodes.nodes[bob_at], "bob", "phone").await;
    let ack = ann.send_ok(&conversation, "before the link breaks").await;
    bob.deliver_of(ack.message_id).await;
    bob.deliver_ack(&conversation, ack.seq).await;
    // A room ann's node owns, with carol subscribed on bob's node.
    let mut room = String::new();
    for n in 0.. {
        room = format!("room:hall-{n}");
        if nodes.owner_of(0, "ann", &room).await == ann_at {
            break;
        }
    }
    let mut carol = Client::connect(&nodes.nodes[bob_at], "carol", "phone").await;
    carol.subscribe(&room, None).await;
    ann.subscribe(&room, None).await;
    let ack = ann.send_ok(&room, "before the link breaks").await;
    carol.deliver_of(ack.message_id).await;
    let failed_hops = async |kind: &str| {
        let text = nodes.nodes[ann_at].get("/metrics", None).await.body;
        ["failed", "timeout", "unreachable", "refused"]
            .iter()
            .map(|outcome| {
                metric(&text, &format!("herald_cluster_peer_requests_total{{kind=\"{kind}\",outcome=\"{outcome}\"}}"))
            })
            .sum::<f64>()
    };

    breaking.send_replace(true);
    let mut sent = Vec::new();
    for n in 0..3 {
        sent.push(ann.send_ok(&conversation, format!("while the link is broken {n}")).await.message_id);
    }
    nodes
        .wait_until("the owner's three hops to bob's node to fail", async || failed_hops("deliver").await >= 3.0)
        .await;
    let to_room = ann.send_ok(&room, "while the link is broken").await;
    nodes.wait_until("the room's hop to carol's node to fail", async || failed_hops("publish_room").await >= 1.0).await;
    breaking.send_replace(false);

    let mut pushed: Vec<u64> = bob.distinct_deliveries(&conversation, 3).await.iter().map(|m| m.id).collect();
    pushed.sort_unstable();
    sent.sort_unstable();
    assert_eq!(pushed, sent, "every message sent while the link was broken, pushed once it was back");
    carol.deliver_of(to_room.message_id).await;
    let asked_again = metric(
        &nodes.nodes[ann_at].get("/metrics", None).await.body,
        "herald_delivery_hop_retries_total{outcome=\"delivered\"}",
    );
    assert!(asked_again >= 1.0, "by asking again: {asked_again}");
    nodes.stop().await;
}

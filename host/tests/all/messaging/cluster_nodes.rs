//! Cluster mode end to end: three `herald serve` processes on loopback sharing Redis and a
//! database, clients spread over them, every message reaching every device wherever it is
//! connected.

use std::collections::{BTreeMap, BTreeSet};

use herald_host::store::Backend;
use herald_proto::Encoding;
use herald_proto::v1;

use super::client::Client;
use super::nodes::{History, Nodes, check_history};
use super::plugins::{configure, install};
use super::server::DEV_KEY;
use super::{WAIT, dm};
use serde_json::json;

/// A dm whose two users are on nodes `a` and `b` and whose owner is node `owner`: the
/// sender's node forwards every send to a third node.
async fn dm_owned_by(nodes: &Nodes, owner: usize, a: &str, b: &str) -> (String, String, String) {
    for k in 0..500 {
        let (from, to) = (format!("{a}{k}"), format!("{b}{k}"));
        let conversation = dm(&from, &to);
        if nodes.owner_of(0, &from, &conversation).await == owner {
            return (from, to, conversation);
        }
    }
    panic!("no dm owned by node {owner} among 500 pairs")
}

async fn three_nodes_carry_dm_group_and_room_traffic(backend: Backend) {
    let nodes = Nodes::start(3, backend).await;
    let cluster = nodes.cluster_of(1).await;
    assert_eq!(cluster["mode"], "cluster", "{cluster}");
    assert_eq!(cluster["members"].as_array().map(Vec::len), Some(3), "{cluster}");
    assert_eq!(cluster["lease"]["held"], true, "{cluster}");
    let ids: std::collections::BTreeSet<u64> =
        [nodes.node_id(0).await, nodes.node_id(1).await, nodes.node_id(2).await].into();
    assert_eq!(ids.len(), 3, "each node leased an id of its own: {ids:?}");

    // A dm between a user on node 0 and one on node 1, owned by node 2: each send is
    // forwarded there, and its message comes back to node 1's device.
    let (from, to, conversation) = dm_owned_by(&nodes, 2, "alice", "bob").await;
    let mut sender = Client::connect(&nodes.nodes[0], &from, "laptop").await;
    let mut receiver = Client::connect(&nodes.nodes[1], &to, "phone").await;
    let mut history = History::default();
    let mut acked = Vec::new();
    for n in 0..5 {
        let ack = sender.send_ok(&conversation, format!("forwarded {n}")).await;
        history.record(&ack);
        acked.push(ack);
    }
    let delivered = receiver.distinct_deliveries(&conversation, 5).await;
    let seqs: Vec<u64> = delivered.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, acked.iter().map(|a| a.seq).collect::<Vec<_>>(), "every message, in seq order");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs increase: {seqs:?}");
    receiver.deliver_ack(&conversation, seqs[4]).await;
    // Readable from every node, the owner's own included.
    let mut reader = Client::connect(&nodes.nodes[2], &to, "tablet").await;
    check_history(&history, &mut reader, &conversation).await;

    // A group with members on every node, one of them with devices on two nodes.
    nodes.nodes[1].create_group("crew", &["gina", "hal", "ivy"]).await;
    let group = "grp:crew";
    let mut gina = Client::connect(&nodes.nodes[0], "gina", "phone").await;
    let mut hal_phone = Client::connect(&nodes.nodes[1], "hal", "phone").await;
    let mut hal_laptop = Client::connect(&nodes.nodes[2], "hal", "laptop").await;
    let mut ivy = Client::connect(&nodes.nodes[2], "ivy", "phone").await;
    let mut sent = Vec::new();
    for n in 0..4 {
        let ack = gina.send_ok(group, format!("to the crew {n}")).await;
        history.record(&ack);
        sent.push(ack.seq);
    }
    for member in [&mut hal_phone, &mut hal_laptop, &mut ivy] {
        let got: Vec<u64> = member.distinct_deliveries(group, 4).await.iter().map(|m| m.seq).collect();
        assert_eq!(got, sent, "every device of every member, in order");
    }
    let from_ivy = ivy.send_ok(group, "from node 2").await;
    gina.deliver_of(from_ivy.message_id).await;
    hal_phone.deliver_of(from_ivy.message_id).await;

    // A room with subscribers on every node: one message, each subscriber gets it once.
    let room = "room:lobby";
    let mut subscribers = Vec::new();
    for (at, name) in [(0, "kim"), (1, "lee"), (2, "max"), (2, "ned")] {
        let mut client = Client::connect(&nodes.nodes[at], name, "phone").await;
        client.subscribe(room, None).await;
        subscribers.push(client);
    }
    let mut publisher = Client::connect(&nodes.nodes[1], "olga", "phone").await;
    publisher.subscribe(room, None).await;
    let announced = publisher.send_ok(room, "welcome, all nodes").await;
    for subscriber in &mut subscribers {
        let message = subscriber.deliver_of(announced.message_id).await.message.expect("a message");
        assert_eq!(message.body.as_ref(), b"welcome, all nodes");
    }

    // Over HTTP, through any node: history of the dm from the node that owns nothing of it.
    let token = nodes.nodes[0].dev_token(&to).await;
    let path = format!("/v1/conversations/{conversation}/messages?after_seq=0&limit=10");
    let page = nodes.nodes[0].get(&path, Some(&token)).await;
    assert_eq!(page.status, 200, "{page:?}");
    assert_eq!(page.json()["messages"].as_array().map(Vec::len), Some(5), "{page:?}");
    nodes.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_carry_dm_group_and_room_traffic_on_postgres() {
    three_nodes_carry_dm_group_and_room_traffic(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_carry_dm_group_and_room_traffic_on_mariadb() {
    three_nodes_carry_dm_group_and_room_traffic(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_device_connecting_to_another_node_kicks_the_first_connection() {
    let nodes = Nodes::start(2, Backend::Postgres).await;
    let mut first = Client::connect(&nodes.nodes[0], "pat", "phone").await;
    // `connected` comes before the route is written: two logins in the same instant are
    // ordered by the route table, and either may be the one kicked. Here the first is in.
    nodes
        .wait_until("the first connection's route to be seen from node 1", async || {
            nodes.nodes[1].get("/v1/users/pat/presence", Some(DEV_KEY)).await.json()["online"] == true
        })
        .await;
    let mut second = Client::connect(&nodes.nodes[1], "pat", "phone").await;
    first.expect_close_code(4009, "the same device connected to another node").await;
    // The new connection is the device's route: a message reaches it there.
    let mut friend = Client::connect(&nodes.nodes[0], "quinn", "phone").await;
    let ack = friend.send_ok(&dm("pat", "quinn"), "still there?").await;
    second.deliver_of(ack.message_id).await;
    nodes.stop().await;
}

/// A member removed through one node can do nothing more through another, at once: the
/// node that made the change tells the others to drop their cached member list before
/// answering. Node 1 owns the group and has its list cached when node 0 removes carol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_removed_on_one_node_cannot_send_through_another() {
    let nodes = Nodes::start(2, Backend::Postgres).await;
    let mut group = None;
    for k in 0..500 {
        let id = format!("crew{k}");
        if nodes.owner_of(0, "carol", &format!("grp:{id}")).await == 1 {
            group = Some(id);
            break;
        }
    }
    let id = group.expect("a group owned by node 1 among 500 ids");
    let conversation = format!("grp:{id}");
    nodes.nodes[0].create_group(&id, &["alice", "carol"]).await;
    let mut carol = Client::connect(&nodes.nodes[1], "carol", "phone").await;
    let mut alice = Client::connect(&nodes.nodes[0], "alice", "laptop").await;
    let before = carol.send_ok(&conversation, "in the crew").await;
    alice.deliver_of(before.message_id).await;
    assert_eq!(carol.history(&conversation, 0, 10).await.messages.len(), 1, "node 1 has read the members");

    let path = format!("/v1/groups/{id}/members/carol");
    let removed = nodes.nodes[0].request("DELETE", &path, Some(DEV_KEY), None).await;
    assert_eq!(removed.status, 204, "{removed:?}");
    let reason = carol.send_rejected(&conversation, "still in?").await;
    assert!(reason.contains("not a member"), "{reason}");
    let rid = carol.send_history(&conversation, 0, 10).await;
    let refused = carol.try_reply(rid, "history_reply", |_| None::<()>).await.expect_err("no longer a member");
    assert_eq!(refused.code, "forbidden", "{refused:?}");
    // Added back through node 0, she may send through node 1 at once.
    let added = nodes.nodes[0].request("PUT", &path, Some(DEV_KEY), None).await;
    assert_eq!(added.status, 204, "{added:?}");
    carol.send_ok(&conversation, "back again").await;
    nodes.stop().await;
}

/// The first-party plugins keep their state in Redis in cluster mode: a room's announcement
/// interval holds across every node, and an announcement id is accepted once cluster-wide,
/// its repeat answering with the original ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announcement_limits_and_once_only_ids_hold_across_nodes() {
    let dir = install(&["room-rate-limit", "announce-archive"]);
    configure(
        &dir,
        "room-rate-limit",
        "[[config.rules]]\npattern = \"room:arena\"\nroom_interval_ms = 100\nsender_interval_ms = 100\nannounce_interval_ms = 60000\n\
         [[config.rules]]\npattern = \"room:*\"\nroom_interval_ms = 100\nsender_interval_ms = 100\nannounce_interval_ms = 100\n",
    );
    let plugins = dir.path().display().to_string();
    let nodes = Nodes::start_with(3, Backend::Postgres, &[("PLUGINS", &plugins)]).await;

    // One room, one announcement to each node within the room's interval: one accepted.
    let mut statuses = Vec::new();
    for (at, node) in nodes.nodes.iter().enumerate() {
        let body = json!({ "content": format!("from node {at}"), "announcement_id": format!("round-{at}") });
        let response = node.post("/v1/rooms/arena/announcements", Some(DEV_KEY), &body).await;
        if response.status == 429 {
            assert!(response.header("retry-after").is_some(), "429 says when: {response:?}");
        }
        statuses.push(response.status);
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [202, 429, 429], "exactly one accepted across the nodes");

    // The same announcement id on two nodes: stored once; the repeat names the original.
    let body = json!({ "content": "maintenance at 10:00", "announcement_id": "maint-1" });
    let first = nodes.nodes[0].post("/v1/rooms/news/announcements", Some(DEV_KEY), &body).await;
    assert_eq!(first.status, 202, "{first:?}");
    // Paced like any announcement to the room: wait out its interval as a caller would.
    let repeat = loop {
        let response = nodes.nodes[2].post("/v1/rooms/news/announcements", Some(DEV_KEY), &body).await;
        let Some(wait) = response.header("retry-after-ms").filter(|_| response.status == 429) else { break response };
        tokio::time::sleep(std::time::Duration::from_millis(wait.parse().expect("ms"))).await;
    };
    assert_eq!(repeat.status, 200, "a repeat is answered like a duplicate send: {repeat:?}");
    let (first, repeat) = (first.json(), repeat.json());
    assert_eq!(repeat["duplicate"], true, "{repeat}");
    assert_eq!((&repeat["message_id"], &repeat["seq"]), (&first["message_id"], &first["seq"]), "the original ids");
    let mut reader = Client::connect(&nodes.nodes[1], "reader", "phone").await;
    let stored = reader.subscribe("room:news", Some(0)).await;
    assert_eq!(stored.messages.len(), 1, "stored once: {stored:?}");
    nodes.stop().await;
}

/// A node shutting down sends each of its clients to another live node: every `go_away`
/// names one of the other nodes' client URLs (`ws://<listen>/v1/ws`, built from the port
/// each node was bound to), every device of a user the same one, and a client reconnecting
/// there logs in and is backfilled what was sent to it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_node_sends_each_client_to_another_live_node() {
    let mut nodes = Nodes::start_with(3, Backend::Postgres, &[("GATEWAY__GO_AWAY_SPREAD_MS", "200")]).await;
    let others: BTreeSet<String> = [nodes.nodes[1].ws_url(), nodes.nodes[2].ws_url()].into();
    let users = ["ada", "ben", "cyd", "dee", "eli", "fay", "gus", "hal"];
    let mut clients = Vec::new();
    for user in users {
        clients.push((user, Client::connect(&nodes.nodes[0], user, "phone").await));
    }
    // A second device of one user, and a client of the JSON encoding, to see the field's name.
    clients.push(("ada", Client::connect(&nodes.nodes[0], "ada", "laptop").await));
    clients.push(("ivy", Client::connect_with(&nodes.nodes[0], Encoding::Json, "ivy", "phone").await));

    nodes.terminate(0).await;
    let mut sent_to: BTreeMap<&str, String> = BTreeMap::new();
    for (user, client) in &mut clients {
        let go_away = client
            .wait_for("go_away", WAIT, |frame| match &frame.body {
                Some(v1::frame::Body::GoAway(go_away)) => Some(go_away.clone()),
                _ => None,
            })
            .await;
        assert!(others.contains(&go_away.reconnect_url), "{user}: one of the other nodes {others:?}: {go_away:?}");
        assert!(go_away.reconnect_after_ms <= 200, "within GATEWAY__GO_AWAY_SPREAD_MS: {go_away:?}");
        if let Some(first) = sent_to.insert(user, go_away.reconnect_url.clone()) {
            assert_eq!(first, go_away.reconnect_url, "every device of {user} goes to the same node");
        }
        if client.encoding == Encoding::Json {
            let field = format!(r#""reconnectUrl":"{}""#, go_away.reconnect_url);
            assert!(client.raw_texts.iter().any(|text| text.contains(&field)), "{field} in {:?}", client.raw_texts);
        }
        client.expect_close_code(1012, "after go_away").await;
    }

    // Sent while they were away, from a node that stays; then each user reconnects where
    // it was told to, and its backfill brings the message.
    nodes.wait_for_members(2).await;
    let mut sender = Client::connect(&nodes.nodes[1], "zoe", "phone").await;
    for (user, url) in &sent_to {
        let ack = sender.send_ok(&dm(user, "zoe"), format!("while {user} was away")).await;
        let at = nodes.nodes.iter().position(|node| node.ws_url() == *url).expect("a node of the cluster");
        let mut back = Client::connect(&nodes.nodes[at], user, "phone").await;
        let message = back.deliver_of(ack.message_id).await.message.expect("a message");
        assert_eq!(message.body.as_ref(), format!("while {user} was away").as_bytes());
    }
    nodes.stop().await;
}

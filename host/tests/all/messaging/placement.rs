//! Placement as an operator sets it up: three nodes with `cluster.placement`, a real nginx
//! configured by `herald cluster nginx-conf`, clients connecting through it with
//! `?user=<user>`. Every connection lands on the home node `/admin/route` names; one that
//! reaches another node directly is served and counted; an nginx config older than the
//! membership shows on `/admin/cluster`. And a node whose shared settings differ from the
//! cluster's refuses to join, naming both values.

use std::process::Command;

use herald_host::store::Backend;
use herald_proto::Encoding;
use serde_json::Value;

use super::client::Client;
use super::nodes::Nodes;
use super::server::DEV_KEY;
use super::{WAIT, metric};
use crate::nginx::Nginx;
use crate::support::poll::poll;

/// Users connecting through nginx, per mode.
const USERS: usize = 1_000;

/// Waits until every node's `/admin/cluster` lists `count` upstream servers under one
/// digest; returns that placement.
pub(super) async fn agreed_placement(nodes: &Nodes, at: &[usize], count: usize) -> Value {
    let what = format!("the nodes to agree on {count} upstream servers");
    poll()
        .within(WAIT)
        .every(std::time::Duration::from_millis(50))
        .until(&what, async || {
            let mut placements = Vec::new();
            for &node in at {
                placements.push(nodes.cluster_of(node).await["placement"].clone());
            }
            let digests: std::collections::BTreeSet<String> =
                placements.iter().map(|p| p["digest"].as_str().unwrap_or_default().to_owned()).collect();
            if digests.len() == 1 && placements.iter().all(|p| p["upstream"].as_array().map(Vec::len) == Some(count)) {
                Ok(placements.swap_remove(0))
            } else {
                Err(format!("{placements:?}"))
            }
        })
        .await
}

/// The home node id `/admin/route` on node `asked` gives `user`.
pub(super) async fn home_of(nodes: &Nodes, asked: usize, user: &str) -> u64 {
    let path = format!("/admin/route?user={user}&command=connect");
    let response = nodes.nodes[asked].get(&path, Some(DEV_KEY)).await;
    assert_eq!(response.status, 200, "GET {path}: {response:?}");
    response.json()["owner"].as_u64().unwrap_or_else(|| panic!("no owner for {user}: {response:?}"))
}

/// `herald cluster nginx-conf` against node `at`, listening where the test's nginx will.
pub(super) fn nginx_conf(nodes: &Nodes, at: usize) -> String {
    let url = format!("http://127.0.0.1:{}", nodes.nodes[at].port);
    let output = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["cluster", "nginx-conf", "--url", &url, "--key", DEV_KEY, "--listen", "LISTEN"])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run herald cluster nginx-conf");
    assert!(output.status.success(), "nginx-conf failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("a config in UTF-8")
}

/// Logs `user` in through `url`; returns the node id `connected` names.
pub(super) async fn connect_via(nodes: &Nodes, url: &str, user: &str) -> (Client, u64) {
    let (mut client, _) = Client::open_at(&nodes.nodes[0], url, Some(Encoding::Proto.subprotocol())).await;
    let connected = client.login(&format!("dev:{user}"), "phone").await.unwrap_or_else(|why| panic!("{user}: {why}"));
    (client, u64::from(connected.node_id))
}

async fn every_user_lands_on_its_home_through_nginx(mode: &str) {
    let mut nodes = Nodes::start_with(3, Backend::Postgres, &[("CLUSTER__PLACEMENT", mode)]).await;
    let placement = agreed_placement(&nodes, &[0, 1, 2], 3).await;
    assert_eq!(placement["mode"], mode, "{placement}");
    let digest = placement["digest"].as_str().expect("a digest").to_owned();
    let config = nginx_conf(&nodes, 1);
    assert!(config.contains(&format!("proxy_set_header X-Herald-Upstream {digest};")), "{config}");
    let nginx = Nginx::start(&config).await;

    let mut homes = Vec::new();
    for i in 0..USERS {
        let user = format!("placed-{i}");
        let url = format!("ws://127.0.0.1:{}/v1/ws?user={user}", nginx.port);
        let (client, landed) = connect_via(&nodes, &url, &user).await;
        let home = home_of(&nodes, i % 3, &user).await;
        assert_eq!(landed, home, "{mode}: {user} landed on node {landed}, but its home is {home}\n{}", nginx.logs());
        homes.push((user, home));
        drop(client);
    }
    let ids = [nodes.node_id(0).await, nodes.node_id(1).await, nodes.node_id(2).await];
    for (at, id) in ids.iter().enumerate() {
        let placement = &nodes.cluster_of(at).await["placement"];
        assert_eq!(placement["away_connections"], 0, "node {at}: {placement}");
        assert_eq!(placement["nginx_matches"], true, "node {at} heard nginx's digest as its own: {placement}");
        let served = homes.iter().filter(|(_, home)| home == id).count();
        assert!(served > USERS / 10, "node {at} is the home of {served} of {USERS} users");
    }

    // A device reaching a node that is not its home (no nginx in the way) is served there,
    // and counted.
    let (user, home) = homes.iter().find(|(_, home)| *home != ids[0]).expect("a user homed elsewhere");
    let direct = format!("{}?user={user}", nodes.nodes[0].ws_url());
    let (_away, landed) = connect_via(&nodes, &direct, user).await;
    assert_eq!(landed, ids[0], "served where it connected, though its home is {home}");
    let placement = &nodes.cluster_of(0).await["placement"];
    assert_eq!(placement["away_connections"], 1, "{placement}");
    let metrics = nodes.nodes[0].get("/metrics", None).await;
    assert_eq!(metric(&metrics.body, "herald_gateway_connections_away_total"), 1.0, "{}", metrics.body);

    // Node 2 leaves and nginx keeps its old config: the nodes left see requests routed by an
    // upstream that is not theirs.
    nodes.terminate(2).await;
    agreed_placement(&nodes, &[0, 1], 2).await;
    let (user, _) = homes.iter().find(|(_, home)| *home == ids[0]).expect("a user homed on node 0");
    let url = format!("ws://127.0.0.1:{}/v1/ws?user={user}", nginx.port);
    let (_stale, landed) = connect_via(&nodes, &url, user).await;
    assert_eq!(landed, ids[0], "nginx still sends {user} to node 0");
    let placement = &nodes.cluster_of(0).await["placement"];
    assert_eq!(placement["nginx_matches"], false, "{placement}");
    assert_eq!(placement["last_stale_digest"], digest.as_str(), "{placement}");
    assert!(placement["stale_upstream_requests"].as_u64() >= Some(1), "{placement}");
    assert_ne!(placement["digest"], digest.as_str(), "the membership changed: {placement}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_user_lands_on_its_home_through_nginx_consistent_hash() {
    every_user_lands_on_its_home_through_nginx("nginx-consistent").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_user_lands_on_its_home_through_nginx_plain_hash() {
    every_user_lands_on_its_home_through_nginx("nginx-hash").await;
}

/// Users connected through nginx when a fourth node joins and nginx reloads the config.
const JOIN_USERS: usize = 300;

/// A fourth node joins a placed cluster and nginx reloads the config `nginx-conf` prints
/// for four: the users that move are only those the new node takes (consistent hashing:
/// none moves between the old nodes), each lands where Herald says its home now is, and
/// each moved device resumes there from the ledger its old node hands over, pushed what
/// was sent while it moved and nothing twice; those that stay resume where they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_node_takes_only_its_share_and_the_devices_it_takes_resume_there() {
    let settings = [("CLUSTER__PLACEMENT", "nginx-consistent"), ("GATEWAY__RECONNECT_GRACE_MS", "60000")];
    let mut nodes = Nodes::start_with(3, Backend::Postgres, &settings).await;
    agreed_placement(&nodes, &[0, 1, 2], 3).await;
    let nginx = Nginx::start(&nginx_conf(&nodes, 0)).await;
    let through_nginx = |user: &str| format!("ws://127.0.0.1:{}/v1/ws?user={user}", nginx.port);
    let mut users = Vec::new();
    for i in 0..JOIN_USERS {
        let user = format!("joining-{i}");
        let (client, landed) = connect_via(&nodes, &through_nginx(&user), &user).await;
        users.push((user, client, landed));
    }
    // Connected straight to node 0: a user that never moves.
    let mut sender = Client::connect(&nodes.nodes[0], "sender", "laptop").await;
    // A connection is resumed from once its own backfill is over.
    nodes.wait_until("every backfill to end", async || nodes.backfills_over().await).await;

    let joined = nodes.add().await;
    let new_id = nodes.node_id(joined).await;
    agreed_placement(&nodes, &[0, 1, 2, 3], 4).await;
    nginx.reload(&nginx_conf(&nodes, joined));
    // nginx's new workers are up once a user the new node took lands there.
    let mut probe = String::new();
    for i in 0.. {
        probe = format!("probe-{i}");
        if home_of(&nodes, 0, &probe).await == new_id {
            break;
        }
    }
    nodes
        .wait_until("nginx to route by the reloaded config", async || {
            connect_via(&nodes, &through_nginx(&probe), &probe).await.1 == new_id
        })
        .await;
    // The probe's backfills are counted before the baseline is read.
    nodes.wait_until("every backfill to end", async || nodes.backfills_over().await).await;
    let resumed = nodes.total(r#"herald_delivery_backfills_total{path="resumed"}"#).await;
    let full = nodes.total(r#"herald_delivery_backfills_total{path="full"}"#).await;

    let mut moved = 0;
    for (user, client, before) in users {
        drop(client);
        let conversation = super::dm("sender", &user);
        let away = sender.send_ok(&conversation, "while you moved").await;
        let (mut client, after) = connect_via(&nodes, &through_nginx(&user), &user).await;
        let home = home_of(&nodes, 0, &user).await;
        assert_eq!(after, home, "{user} landed on node {after}, but its home is now {home}\n{}", nginx.logs());
        if after != before {
            assert_eq!(after, new_id, "{user} moved from node {before} to {after}, not to the node that joined");
            moved += 1;
        }
        let pushed = client.distinct_deliveries(&conversation, 1).await;
        assert_eq!(pushed[0].id, away.message_id, "{user}: what was sent while it moved, and nothing before it");
    }
    let share = moved as f64 / JOIN_USERS as f64;
    // The new node's share of the ring varies with the addresses (ports of the system's
    // choosing): a quarter on average; plain hashing would move about three quarters.
    assert!(moved > 0 && share < 0.35, "{moved} of {JOIN_USERS} users moved");
    let handed_over = nodes.total(r#"herald_gateway_handovers_total{resumed="yes"}"#).await;
    assert_eq!(handed_over, moved as f64, "every moved device resumed from a handed-over ledger");
    let resumed_now = nodes.total(r#"herald_delivery_backfills_total{path="resumed"}"#).await - resumed;
    assert_eq!(resumed_now, JOIN_USERS as f64, "every device resumed, moved or not");
    assert_eq!(nodes.total(r#"herald_delivery_backfills_total{path="full"}"#).await, full, "no full backfill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_other_placement_or_ring_points_refuses_to_join_naming_both_values() {
    let nodes = Nodes::start_with(1, Backend::Postgres, &[("CLUSTER__PLACEMENT", "nginx-consistent")]).await;
    let refusals = [
        (
            "CLUSTER__PLACEMENT",
            "nginx-hash",
            r#"cluster.placement is "nginx-hash" here but "nginx-consistent" in the cluster"#,
        ),
        ("CLUSTER__VIRTUAL_NODES", "100", r#"cluster.virtual_nodes is "100" here but "160" in the cluster"#),
    ];
    for (key, value, named) in refusals {
        let printed = nodes.options().set(key, value).refused().await;
        assert!(printed.contains(named), "{key}={value}: expected {named:?} in:\n{printed}");
    }
    // The same settings join.
    let cluster = nodes.cluster_of(0).await;
    assert_eq!(cluster["members"].as_array().map(Vec::len), Some(1), "the refused nodes never joined: {cluster}");
    let joined = nodes.options().start().await;
    let response = joined.get("/admin/cluster", Some(DEV_KEY)).await;
    assert_eq!(response.json()["placement"]["mode"], "nginx-consistent", "{response:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_placement_is_refused_naming_the_allowed_values() {
    let nodes = Nodes::start(1, Backend::Postgres).await;
    let printed = nodes.options().set("CLUSTER__PLACEMENT", "round-robin").refused().await;
    for named in ["round-robin", "none", "nginx-consistent", "nginx-hash"] {
        assert!(printed.contains(named), "{named:?} missing in:\n{printed}");
    }
}

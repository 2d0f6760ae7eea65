//! A node of a placed cluster restarted behind nginx, as a deploy restarts it: with SIGTERM
//! (it saves its devices' ledgers as it stops) and with `kill -9` (its last save is up to a
//! second old). Its users come back through nginx to the same node, and each is resumed
//! from its ledger, not backfilled in full: it is pushed what it had not acked before the
//! restart, the traffic sent to it all along, and what was sent while the node was down in
//! a conversation new to it (which no ledger names), each once and in order, and nothing it
//! had acked.

use herald_host::store::Backend;
use herald_proto::v1;

use super::client::Client;
use super::nodes::Nodes;
use super::placement::{agreed_placement, connect_via, nginx_conf};
use super::{WAIT, dm, uuid};
use crate::nginx::Nginx;

/// Users connecting through nginx; about a third have the restarted node as their home.
const USERS: usize = 90;

/// How a node is restarted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stop {
    Terminate,
    Kill,
}

async fn a_restarted_node_takes_its_devices_back(stop: Stop) {
    let settings = [("CLUSTER__PLACEMENT", "nginx-consistent"), ("GATEWAY__RECONNECT_GRACE_MS", "60000")];
    let mut nodes = Nodes::start_with(3, Backend::Postgres, &settings).await;
    agreed_placement(&nodes, &[0, 1, 2], 3).await;
    let nginx = Nginx::start(&nginx_conf(&nodes, 0)).await;
    let through_nginx = |user: &str| format!("ws://127.0.0.1:{}/v1/ws?user={user}", nginx.port);
    let ids = [nodes.node_id(0).await, nodes.node_id(1).await, nodes.node_id(2).await];
    let mut users = Vec::new();
    for i in 0..USERS {
        let user = format!("restarting-{i}");
        let (client, landed) = connect_via(&nodes, &through_nginx(&user), &user).await;
        users.push((user, client, landed));
    }
    // The node restarted is the home of the most users but node 0, where the sender is.
    let homed = |id: u64| users.iter().filter(|(_, _, landed)| *landed == id).count();
    let target = if homed(ids[1]) >= homed(ids[2]) { 1 } else { 2 };
    let mut ours: Vec<(String, Client)> = Vec::new();
    for (user, client, landed) in users {
        if landed == ids[target] {
            ours.push((user, client));
        }
    }
    assert!(ours.len() >= 10, "node {target} is the home of only {} users", ours.len());
    let mut sender = Client::connect(&nodes.nodes[0], "sender", "laptop").await;
    // Writes only while the node is down, in conversations that do not exist before: what
    // the restarted node could not hear of, and no saved ledger names.
    let mut late = Client::connect(&nodes.nodes[0], "late", "laptop").await;

    // Before the restart each device acks one message and is pushed another it does not ack.
    let mut unacked = Vec::new();
    for (user, client) in &mut ours {
        let conversation = dm("sender", user);
        let acked = sender.send_ok(&conversation, "acked").await;
        let deliver = client.deliver_of(acked.message_id).await;
        client.deliver_ack(&conversation, deliver.message.expect("a message").seq).await;
        unacked.push(sender.send_ok(&conversation, "pushed, not acked").await);
    }
    for ((_, client), pushed) in ours.iter_mut().zip(&unacked) {
        client.deliver_of(pushed.message_id).await;
        client.ping().await; // the ack before it is taken
    }
    let restarted = &nodes.nodes[target];
    let saves = restarted.metric("herald_delivery_ledger_saves_total").await;
    // A save that began after every ack was taken: the one after the one under way.
    nodes
        .wait_until("two more saves of the ledgers", async || {
            restarted.metric("herald_delivery_ledger_saves_total").await >= saves + 2.0
        })
        .await;
    assert_eq!(restarted.metric("herald_delivery_ledgers_saved").await, ours.len() as f64);

    // Traffic all along: round after round, one message to each of the node's users, from
    // before it stops until a round ends after it is back.
    let (back, mut is_back) = tokio::sync::watch::channel(false);
    let names: Vec<String> = ours.iter().map(|(user, _)| user.clone()).collect();
    let traffic = tokio::spawn(async move {
        let mut sent: Vec<Vec<u64>> = vec![Vec::new(); names.len()];
        loop {
            for (to, user) in names.iter().enumerate() {
                sent[to].push(send_until_stored(&mut sender, &dm("sender", user), "traffic").await.message_id);
            }
            if *is_back.borrow_and_update() {
                return sent;
            }
        }
    });
    match stop {
        Stop::Terminate => nodes.terminate(target).await,
        Stop::Kill => nodes.kill9(target),
    }
    let mut while_down = Vec::new();
    for (user, _) in &ours {
        while_down.push(send_until_stored(&mut late, &dm("late", user), "sent while the node was down").await);
    }
    nodes.restart_in_place(target).await;
    back.send_replace(true);
    let restored = nodes.nodes[target].metric("herald_gateway_restored_total").await;
    assert_eq!(restored, ours.len() as f64, "{stop:?}: every device whose home it is is parked again");
    let traffic = traffic.await.expect("the traffic ran");

    for ((((user, old), pushed), down), sent) in ours.into_iter().zip(&unacked).zip(&while_down).zip(traffic) {
        drop(old);
        let conversation = dm("sender", &user);
        let (mut client, landed) = connect_via(&nodes, &through_nginx(&user), &user).await;
        assert_eq!(landed, nodes.node_id(target).await, "{user} comes back to the restarted node");
        // Once each, in order: what it had not acked, then the traffic; never what it acked.
        let expected: Vec<u64> = std::iter::once(pushed.message_id).chain(sent).collect();
        let got = client.distinct_deliveries(&conversation, expected.len()).await;
        assert_eq!(
            got.iter().map(|message| message.id).collect::<Vec<_>>(),
            expected,
            "{stop:?}: {user} is pushed what it had not acked and the traffic, in order, and not what it acked"
        );
        let first = client.distinct_deliveries(&dm("late", &user), 1).await;
        assert_eq!(first[0].id, down.message_id, "{stop:?}: {user} is pushed what was sent while its node was down");
    }
    nodes.wait_until("every backfill to end", async || nodes.backfills_over().await).await;
    let node = &nodes.nodes[target];
    let resumed = node.metric(r#"herald_delivery_backfills_total{path="resumed"}"#).await;
    let full = node.metric(r#"herald_delivery_backfills_total{path="full"}"#).await;
    assert_eq!((resumed, full), (restored, 0.0), "{stop:?}: every device resumed, none backfilled in full");
}

/// Sends `body` to `conversation`, again with the same id after each `RETRY` (the owner
/// of the conversation may be the node that went down, until the others see it gone).
async fn send_until_stored(sender: &mut Client, conversation: &str, body: &str) -> v1::SendAck {
    let deadline = tokio::time::Instant::now() + WAIT;
    sender.resend_until_stored(&uuid(), conversation, body.as_bytes(), deadline).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_with_sigterm_takes_its_devices_back_through_nginx() {
    a_restarted_node_takes_its_devices_back(Stop::Terminate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_and_restarted_takes_its_devices_back_through_nginx() {
    a_restarted_node_takes_its_devices_back(Stop::Kill).await;
}

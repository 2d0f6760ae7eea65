//! What a user sees, on one node and on three (`world`): each scenario is written from
//! PROTOCOL.md as a client would, once, and runs on one embedded node and on three cluster
//! nodes whose users are spread so that every send is forwarded to its conversation's owner
//! and every message comes back to a third node. Whatever one node promises, three keep.

use std::time::Duration;

use herald_proto::v1;
use herald_proto::v1::send_ack::Status;
use serde_json::json;

use super::client::Client;
use super::plugins::{configure, install};
use super::server::DEV_KEY;
use super::world::{Topology, World};
use super::{dm, uuid};
use crate::on_both_topologies;

/// The bodies of `messages`, as text.
fn bodies(messages: &[v1::Message]) -> Vec<String> {
    messages.iter().map(|message| String::from_utf8_lossy(&message.body).into_owned()).collect()
}

/// A direct chat both ways: every message arrives once, in the order sent, with the ids and
/// body its ack named; the reply comes back the same way.
async fn a_direct_chat_arrives_in_order_both_ways(topology: Topology) {
    let world = World::start(topology, &[]).await;
    let conversation = dm("alice", "bob");
    let places = world.places("alice", &conversation).await;
    let mut alice = world.connect(places.sender, "alice", "laptop").await;
    let mut bob = world.connect(places.recipient, "bob", "phone").await;

    let mut acks = Vec::new();
    for n in 0..5 {
        acks.push(alice.send_ok(&conversation, format!("hello {n}")).await);
    }
    let delivered = bob.distinct_deliveries(&conversation, 5).await;
    let got: Vec<(u64, u64)> = delivered.iter().map(|m| (m.id, m.seq)).collect();
    let acked: Vec<(u64, u64)> = acks.iter().map(|a| (a.message_id, a.seq)).collect();
    assert_eq!(got, acked, "every message once, in the order sent, with the ids its ack named");
    assert_eq!(bodies(&delivered), (0..5).map(|n| format!("hello {n}")).collect::<Vec<_>>());
    assert!(delivered.iter().all(|m| m.sender == "alice" && m.sender_device == "laptop"));
    bob.deliver_ack(&conversation, acks[4].seq).await;

    let reply = bob.send_ok(&conversation, "hi alice").await;
    assert!(reply.seq > acks[4].seq, "seqs keep increasing: {} after {}", reply.seq, acks[4].seq);
    let back = alice.deliver_of(reply.message_id).await.message.expect("a message");
    assert_eq!((back.seq, back.body.as_ref()), (reply.seq, b"hi alice".as_slice()));
    world.stop().await;
}

/// A device that types fast sends without waiting for each ack: the conversation reads in
/// the order it sent, and the recipient gets the messages in that order.
async fn pipelined_sends_of_one_device_keep_the_order_sent(topology: Topology) {
    const SENDS: usize = 20;
    let world = World::start(topology, &[]).await;
    let conversation = dm("alice", "bob");
    let places = world.places("alice", &conversation).await;
    let mut alice = world.connect(places.sender, "alice", "laptop").await;
    let mut bob = world.connect(places.recipient, "bob", "phone").await;

    let ids: Vec<String> = (0..SENDS).map(|_| uuid()).collect();
    for (n, id) in ids.iter().enumerate() {
        alice.send_with(id, &conversation, 1, format!("typed {n}").as_bytes()).await;
    }
    let mut seqs = Vec::new();
    for id in &ids {
        let ack = alice.ack_of(id).await;
        assert_eq!(ack.status(), Status::Ok, "{ack:?}");
        seqs.push(ack.seq);
    }
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "seqs in the order sent: {seqs:?}");
    let delivered = bob.distinct_deliveries(&conversation, SENDS).await;
    assert_eq!(bodies(&delivered), (0..SENDS).map(|n| format!("typed {n}")).collect::<Vec<_>>());
    world.stop().await;
}

/// A device whose connection dropped and that comes back within the reconnect grace, after
/// whatever routing information about it could have been cached has expired, is pushed what
/// was sent while it was away, without asking for it.
async fn a_device_back_within_the_grace_is_pushed_what_was_sent_meanwhile(topology: Topology) {
    const ROUTE_CACHE_MS: u64 = 200;
    let cache = ROUTE_CACHE_MS.to_string();
    let world =
        World::start(topology, &[("GATEWAY__RECONNECT_GRACE_MS", "60000"), ("CLUSTER__ROUTE_CACHE_MS", &cache)]).await;
    let conversation = dm("alice", "bob");
    let places = world.places("alice", &conversation).await;
    let mut alice = world.connect(places.sender, "alice", "laptop").await;
    let mut bob = world.connect(places.recipient, "bob", "phone").await;
    let read = alice.send_ok(&conversation, "read already").await;
    bob.deliver_of(read.message_id).await;
    bob.deliver_ack(&conversation, read.seq).await;
    bob.ping().await;
    drop(bob);
    world.wait_until_offline("bob", "phone").await;
    // Set-up, not a verdict: away for longer than any cached route of bob lives.
    tokio::time::sleep(Duration::from_millis(3 * ROUTE_CACHE_MS)).await;

    let away = alice.send_ok(&conversation, "while you were away").await;
    let mut bob = world.connect(places.recipient, "bob", "phone").await;
    let pushed = bob.deliver_of(away.message_id).await.message.expect("a message");
    assert_eq!((pushed.seq, pushed.body.as_ref()), (away.seq, b"while you were away".as_slice()));
    let after = alice.send_ok(&conversation, "welcome back").await;
    bob.deliver_of(after.message_id).await;
    world.stop().await;
}

/// A device whose connection dropped and that comes back within the reconnect grace on
/// another node (on one node: the same one) resumes where it was: it is pushed what it had
/// not acked and what was sent while it was away, in order, and nothing it acked; its
/// backfill reads only what it may lack (a resumed one), never every conversation.
async fn a_device_back_within_the_grace_on_any_node_resumes_where_it_was(topology: Topology) {
    let world = World::start(topology, &[("GATEWAY__RECONNECT_GRACE_MS", "60000")]).await;
    let conversation = dm("alice", "bob");
    let places = world.places("alice", &conversation).await;
    let mut alice = world.connect(places.sender, "alice", "laptop").await;
    let mut bob = world.connect(places.recipient, "bob", "phone").await;
    let read = alice.send_ok(&conversation, "read already").await;
    bob.deliver_of(read.message_id).await;
    bob.deliver_ack(&conversation, read.seq).await;
    let unacked = alice.send_ok(&conversation, "pushed, not acked").await;
    bob.deliver_of(unacked.message_id).await;
    // The ack above reaches the server before the drop: a ping answered after it.
    bob.ping().await;
    world.wait_until_backfills_over().await;
    drop(bob);
    world.wait_until_offline("bob", "phone").await;
    alice.send_ok(&conversation, "while away 1").await;
    alice.send_ok(&conversation, "while away 2").await;
    let (resumed, full) = (world.backfills("resumed").await, world.backfills("full").await);

    // On three nodes, back on the node owning the conversation: neither the one it left nor
    // the sender's.
    let mut bob = world.connect(places.owner, "bob", "phone").await;
    // Seq order: a push of what it acked would come first.
    let pushed = bob.distinct_deliveries(&conversation, 3).await;
    assert_eq!(bodies(&pushed), ["pushed, not acked", "while away 1", "while away 2"], "what it lacked, in order");
    let after = alice.send_ok(&conversation, "welcome back").await;
    bob.deliver_of(after.message_id).await;
    assert_eq!(world.backfills("resumed").await, resumed + 1.0, "the reconnect resumed\n{}", world.log_tails());
    assert_eq!(world.backfills("full").await, full, "no full backfill");
    world.stop().await;
}

/// A device that connects again on another node while its old connection still looks
/// alive: the old one is closed (4009) and the new one is pushed what was pushed to the old
/// one and not acked, then what is sent after, from a resumed backfill.
async fn a_device_back_on_another_node_before_its_drop_is_noticed_resumes(topology: Topology) {
    let world = World::start(topology, &[]).await;
    let conversation = dm("alice", "bob");
    let places = world.places("alice", &conversation).await;
    let mut alice = world.connect(places.sender, "alice", "laptop").await;
    let mut stale = world.connect(places.recipient, "bob", "phone").await;
    let read = alice.send_ok(&conversation, "read").await;
    stale.deliver_of(read.message_id).await;
    stale.deliver_ack(&conversation, read.seq).await;
    let unacked = alice.send_ok(&conversation, "pushed to the stale socket").await;
    stale.deliver_of(unacked.message_id).await;
    stale.ping().await;
    world.wait_until_backfills_over().await;
    let resumed = world.backfills("resumed").await;
    let reconnects = world.total(r#"herald_gateway_reconnects_total{resumed="yes"}"#).await;

    let mut bob = world.connect(places.owner, "bob", "phone").await;
    stale.expect_close_code(4009, "the newer connection of the same device wins").await;
    let pushed = bob.distinct_deliveries(&conversation, 1).await;
    assert_eq!(bodies(&pushed), ["pushed to the stale socket"]);
    let after = alice.send_ok(&conversation, "after the switch").await;
    assert_eq!(bob.deliver_of(after.message_id).await.message.expect("message").body.as_ref(), b"after the switch");
    assert_eq!(world.backfills("resumed").await, resumed + 1.0, "the reconnect resumed\n{}", world.log_tails());
    let resumed_reconnects = world.total(r#"herald_gateway_reconnects_total{resumed="yes"}"#).await;
    assert_eq!(resumed_reconnects, reconnects + 1.0, "counted as a resumed reconnect");
    world.stop().await;
}

/// Every device of every member of a group gets each message once, in order; one member
/// has devices on two nodes.
async fn every_device_of_every_group_member_gets_each_message_in_order(topology: Topology) {
    let world = World::start(topology, &[]).await;
    let group = "grp:crew";
    world.node(0).create_group("crew", &["gina", "hal", "ivy"]).await;
    let places = world.places("gina", group).await;
    let mut gina = world.connect(places.sender, "gina", "phone").await;
    let mut hal_phone = world.connect(places.recipient, "hal", "phone").await;
    let mut hal_laptop = world.connect(places.owner, "hal", "laptop").await;
    let mut ivy = world.connect(places.recipient, "ivy", "phone").await;
    let mut gina_tablet = world.connect(places.recipient, "gina", "tablet").await;

    let mut sent = Vec::new();
    for n in 0..4 {
        sent.push(gina.send_ok(group, format!("to the crew {n}")).await.seq);
    }
    for device in [&mut hal_phone, &mut hal_laptop, &mut ivy, &mut gina_tablet] {
        let got: Vec<u64> = device.distinct_deliveries(group, 4).await.iter().map(|m| m.seq).collect();
        assert_eq!(got, sent, "every device of every member, the sender's other device too, in order");
    }
    let from_ivy = ivy.send_ok(group, "from ivy").await;
    gina.deliver_of(from_ivy.message_id).await;
    hal_laptop.deliver_of(from_ivy.message_id).await;
    world.stop().await;
}

/// Room subscribers get each message live, once; one back from a while away catches up
/// with `since_seq`, and an announcement posted over HTTP reaches every subscriber.
async fn room_subscribers_get_messages_live_and_catch_up_since_a_seq(topology: Topology) {
    let world = World::start(topology, &[]).await;
    let room = "room:lobby";
    let places = world.places("olga", room).await;
    let mut olga = world.connect(places.sender, "olga", "phone").await;
    olga.subscribe(room, None).await;
    let mut kim = world.connect(places.recipient, "kim", "phone").await;
    kim.subscribe(room, None).await;
    let mut lee = world.connect(places.owner, "lee", "phone").await;
    lee.subscribe(room, None).await;

    let first = olga.send_ok(room, "welcome").await;
    for subscriber in [&mut kim, &mut lee] {
        let message = subscriber.deliver_of(first.message_id).await.message.expect("a message");
        assert_eq!((message.seq, message.body.as_ref()), (first.seq, b"welcome".as_slice()));
    }

    kim.unsubscribe(room).await;
    let missed = olga.send_ok(room, "while kim was out").await;
    let announced = world
        .node(places.owner)
        .post("/v1/rooms/lobby/announcements", Some(DEV_KEY), &json!({ "content": "doors close at 9" }))
        .await;
    assert_eq!(announced.status, 202, "{announced:?}");
    let announcement = announced.json();
    assert_eq!(announcement["archived"], true, "stored in the room: {announcement}");
    let announcement_seq: u64 =
        announcement["seq"].as_str().and_then(|seq| seq.parse().ok()).expect("seq, a decimal string");
    let caught_up = kim.subscribe(room, Some(first.seq)).await;
    let got: Vec<u64> = caught_up.messages.iter().map(|m| m.seq).collect();
    assert_eq!(got.first(), Some(&missed.seq), "the catch-up starts after the seq named: {caught_up:?}");
    assert_eq!(bodies(&caught_up.messages), ["while kim was out", "doors close at 9"]);
    assert_eq!(caught_up.latest_seq, *got.last().expect("two messages"));
    assert_eq!(got[1], announcement_seq, "the announcement's seq, as its answer named it");
    for subscriber in [&mut olga, &mut lee] {
        let message = subscriber.deliver_in_body(room, "doors close at 9").await;
        assert_eq!(message.seq, got[1]);
    }
    world.stop().await;
}

/// A send repeated with the same `client_msg_id` (the first ack was lost) is stored once:
/// the repeat, on the same connection or on another device's, answers DUPLICATE with the
/// original's ids, and the recipient gets the message once.
async fn a_repeated_client_msg_id_is_stored_once(topology: Topology) {
    let world = World::start(topology, &[]).await;
    let conversation = dm("alice", "bob");
    let places = world.places("alice", &conversation).await;
    let mut alice = world.connect(places.sender, "alice", "laptop").await;
    let mut bob = world.connect(places.recipient, "bob", "phone").await;

    let id = uuid();
    alice.send_with(&id, &conversation, 1, b"only once").await;
    let first = alice.ack_of(&id).await;
    assert_eq!(first.status(), Status::Ok, "{first:?}");
    alice.send_with(&id, &conversation, 1, b"only once").await;
    let again = alice.ack_of(&id).await;
    assert_eq!(again.status(), Status::Duplicate, "{again:?}");
    assert_eq!((again.message_id, again.seq), (first.message_id, first.seq), "the original's ids");

    // The same client_msg_id from the sender reconnected elsewhere: still the original.
    drop(alice);
    let mut alice = world.connect(places.recipient, "alice", "laptop").await;
    alice.send_with(&id, &conversation, 1, b"only once").await;
    let elsewhere = alice.ack_of(&id).await;
    assert_eq!(elsewhere.status(), Status::Duplicate, "{elsewhere:?}");
    assert_eq!((elsewhere.message_id, elsewhere.seq), (first.message_id, first.seq));

    let marker = alice.send_ok(&conversation, "marker").await;
    let delivered = bob.distinct_deliveries(&conversation, 2).await;
    assert_eq!(delivered.iter().map(|m| m.id).collect::<Vec<_>>(), [first.message_id, marker.message_id]);
    let history = bob.whole_history(&conversation).await;
    assert_eq!(bodies(&history), ["only once", "marker"], "stored once");
    world.stop().await;
}

/// A device that was never online pulls what was sent to it: `sync` from its cursors, with
/// `complete_through_seq` saying how far it may trust what it got, and `history` backwards.
async fn an_offline_device_pulls_what_it_missed_with_sync_and_history(topology: Topology) {
    let world = World::start(topology, &[]).await;
    let conversation = dm("carol", "dan");
    let places = world.places("carol", &conversation).await;
    let mut carol = world.connect(places.sender, "carol", "laptop").await;
    let mut acks = Vec::new();
    for n in 0..6 {
        acks.push(carol.send_ok(&conversation, format!("note {n}")).await);
    }

    let mut dan = world.connect(places.recipient, "dan", "phone").await;
    let reply = dan.sync(&[(conversation.as_str(), acks[1].seq)], 100).await;
    let conversation_reply =
        reply.conversations.iter().find(|c| c.conversation == conversation).expect("the conversation synced");
    let seqs: Vec<u64> = conversation_reply.messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, acks[2..].iter().map(|a| a.seq).collect::<Vec<_>>(), "everything after the cursor, in order");
    assert!(conversation_reply.complete_through_seq >= acks[5].seq, "{conversation_reply:?}");

    let page = dan.history(&conversation, acks[3].seq, 2).await;
    assert_eq!(page.messages.iter().map(|m| m.seq).collect::<Vec<_>>(), [acks[1].seq, acks[2].seq]);
    assert!(page.has_more, "older messages remain: {page:?}");
    world.stop().await;
}

/// A node that just started (compiling its plugins) is not loaded: a degrade plugin that
/// sheds delivery past a CPU load keeps every node at `normal` through its start, and the
/// first message is pushed whole, not as a `sync_hint`.
async fn a_starting_node_does_not_take_its_own_warm_up_for_load(topology: Topology) {
    const INTERVAL_MS: u64 = 100;
    let dir = install(&["degrade-tiers", "room-rate-limit", "announce-archive"]);
    // Pull-only past a quarter of the cores, held for 10 s: a start counted as load would
    // show for the whole window below.
    configure(&dir, "degrade-tiers", "hold_ms = 10000\n[config.pull_only]\ncpu_load = 0.25\n");
    let (plugins, interval) = (dir.path().display().to_string(), INTERVAL_MS.to_string());
    let world = World::start(topology, &[("PLUGINS", &plugins), ("DELIVERY__DEGRADE_INTERVAL_MS", &interval)]).await;
    // "Must not happen" for twenty sample intervals from the moment every node answers.
    for _ in 0..20 {
        for at in 0..world.count() {
            let health = world.node(at).get("/admin/health", Some(DEV_KEY)).await.json();
            assert_eq!(health["tier"], "normal", "node {at} degraded itself while starting: {health}");
        }
        tokio::time::sleep(Duration::from_millis(INTERVAL_MS)).await;
    }
    let conversation = dm("alice", "bob");
    let places = world.places("alice", &conversation).await;
    let mut alice = world.connect(places.sender, "alice", "laptop").await;
    let mut bob = world.connect(places.recipient, "bob", "phone").await;
    let first = alice.send_ok(&conversation, "the first message").await;
    let pushed = bob.deliver_of(first.message_id).await;
    assert_eq!(pushed.attempt, 1, "pushed whole, at once: {pushed:?}");
    world.stop().await;
}

/// A device that never reads while a lot is sent to it overflows its queue and is closed
/// with 4008; the sender is never held back, and another device on the same node keeps
/// getting its messages. What it missed is stored, to pull.
async fn a_device_that_never_reads_is_closed_and_nobody_else_waits_for_it(topology: Topology) {
    const SLOW: &str = "never-reads";
    let world = World::start(topology, &[("GATEWAY__SEND_QUEUE", "16")]).await;
    let conversation = dm("flood", "slow");
    let places = world.places("flood", &conversation).await;
    // From here on `slow` never reads: its socket buffers fill, then its queue.
    let mut slow = world.connect(places.recipient, "slow", SLOW).await;
    let mut flood = world.connect(places.sender, "flood", "laptop").await;
    let mut dave = world.connect(places.recipient, "dave", "phone").await;
    // The loop below floods while the slow one is online: it must be, first.
    world.wait_until_online(places.recipient, "slow", SLOW).await;
    let body = vec![b'x'; 32 * 1024];
    let mut sent = 0;
    // Up to 1,000 messages of 32 KiB, each acked OK: never held back by the slow one.
    while sent < 1_000 && world.is_online(places.recipient, "slow", SLOW).await {
        for _ in 0..8 {
            flood.send_ok(&conversation, &body).await;
        }
        sent += 8;
    }
    let beside = flood.send_ok(&dm("dave", "flood"), "meanwhile").await;
    dave.deliver_of(beside.message_id).await;
    // On three nodes the pushes trail the acks by a hop: still without reading, wait for the
    // server to let the slow one go (reading now would drain its socket and rescue it).
    world.wait_until_offline("slow", SLOW).await;
    let closed = slow.expect_closed(super::WAIT).await;
    assert_eq!(closed.code, Some(4008), "after {sent} messages of 32 KiB: {closed:?}");

    // Stored for the slow device to pull when it is back. (Its reconnect is slow_consumer.rs's:
    // here, on three nodes, the flood's last hops may still be arriving and would overflow a
    // queue of 16 again.)
    let page = flood.history(&conversation, 0, 10).await;
    assert_eq!(page.messages.len(), sent.min(10), "the flood is stored: {} in the page", page.messages.len());
    assert!(page.messages.iter().all(|m| m.body.len() == body.len()), "the flood's messages");
    world.stop().await;
}

/// A node stopped as a service manager stops it tells its devices where to go (`go_away`,
/// then 1012); a device that goes there gets what was sent while it moved.
async fn a_stopping_node_hands_its_devices_over_and_nothing_is_lost(topology: Topology) {
    let mut world = World::start(topology, &[("GATEWAY__GO_AWAY_SPREAD_MS", "200")]).await;
    let conversation = dm("alice", "bob");
    let places = world.places("alice", &conversation).await;
    let mut alice = world.connect(places.sender, "alice", "laptop").await;
    let mut bob = world.connect(places.recipient, "bob", "phone").await;
    let before = alice.send_ok(&conversation, "before the move").await;
    bob.deliver_of(before.message_id).await;
    bob.deliver_ack(&conversation, before.seq).await;

    world.terminate(places.recipient).await;
    let go_away = bob
        .wait_for("go_away", super::WAIT, |frame| match &frame.body {
            Some(v1::frame::Body::GoAway(go_away)) => Some(go_away.clone()),
            _ => None,
        })
        .await;
    bob.expect_close_code(1012, "after go_away").await;
    let to = if world.is_cluster() {
        let to = world.node_at(&go_away.reconnect_url);
        assert!(to.is_some_and(|at| at != places.recipient), "another live node: {go_away:?}");
        to.expect("a node")
    } else {
        // One node: the device comes back to it once it is up again, as does its sender.
        world.restart(0).await;
        alice = world.connect(0, "alice", "laptop").await;
        0
    };
    let after = alice.send_ok(&conversation, "while you moved").await;
    let mut bob = world.connect(to, "bob", "phone").await;
    let message = bob.deliver_of(after.message_id).await.message.expect("a message");
    assert_eq!(message.body.as_ref(), b"while you moved");
    world.stop().await;
}

/// Presence, asked of any node, names a user's connected devices and when the user was
/// last seen: now while a device is connected, and once the last one left, when it left.
async fn presence_says_who_is_online_and_when_they_were_last_seen(topology: Topology) {
    let world = World::start(topology, &[]).await;
    let conversation = dm("alice", "bob");
    let places = world.places("alice", &conversation).await;
    let never = world.presence(places.sender, "bob").await;
    assert_eq!((never["online"].as_bool(), never["last_seen_ms"].is_null()), (Some(false), true), "{never}");

    let bob = world.connect(places.recipient, "bob", "phone").await;
    world.wait_until_online(places.sender, "bob", "phone").await;
    let online = world.presence(places.sender, "bob").await;
    let devices: Vec<&str> =
        online["devices"].as_array().into_iter().flatten().filter_map(|d| d["device"].as_str()).collect();
    assert_eq!((online["online"].as_bool(), devices), (Some(true), vec!["phone"]), "{online}");
    let seen_online = online["last_seen_ms"].as_u64().expect("seen now");

    bob.close().await;
    world.wait_until_offline("bob", "phone").await;
    let offline = world.presence(places.owner, "bob").await;
    assert_eq!(offline["online"].as_bool(), Some(false), "{offline}");
    let left = offline["last_seen_ms"].as_u64().expect("when bob left");
    // Node and Redis read the same machine's clock; a second of slack for their rounding.
    assert!(
        left + 1_000 >= seen_online && left < seen_online + 60_000,
        "left at {left}, after it was seen online at {seen_online}"
    );
    world.stop().await;
}

on_both_topologies!(
    a_device_that_never_reads_is_closed_and_nobody_else_waits_for_it,
    a_stopping_node_hands_its_devices_over_and_nothing_is_lost,
    a_starting_node_does_not_take_its_own_warm_up_for_load,
    a_direct_chat_arrives_in_order_both_ways,
    pipelined_sends_of_one_device_keep_the_order_sent,
    a_device_back_within_the_grace_is_pushed_what_was_sent_meanwhile,
    a_device_back_within_the_grace_on_any_node_resumes_where_it_was,
    a_device_back_on_another_node_before_its_drop_is_noticed_resumes,
    every_device_of_every_group_member_gets_each_message_in_order,
    room_subscribers_get_messages_live_and_catch_up_since_a_seq,
    a_repeated_client_msg_id_is_stored_once,
    an_offline_device_pulls_what_it_missed_with_sync_and_history,
    presence_says_who_is_online_and_when_they_were_last_seen,
);

impl Client {
    /// The next message of `room` whose body is `body`, pushed to this client.
    async fn deliver_in_body(&mut self, room: &str, body: &str) -> v1::Message {
        let what = format!("a deliver in {room} of {body:?}");
        self.wait_for(&what, super::WAIT, |frame| match &frame.body {
            Some(v1::frame::Body::Deliver(deliver)) => deliver
                .message
                .as_ref()
                .filter(|m| m.conversation == room && m.body.as_ref() == body.as_bytes())
                .cloned(),
            _ => None,
        })
        .await
    }
}

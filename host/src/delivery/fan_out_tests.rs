//! `Delivery::fan_out`, seen through the seams it pushes to: sessions' outboxes (recording),
//! the route table (counting its lookups) and the node bus (recording what other nodes are
//! asked).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::config::DeliveryConfig;
use crate::maps::HashMap;
use crate::model::{ConnectionId, DeviceId, GroupId, NodeId, UserId};
use crate::routing::bus::Addressed;
use crate::routing::rooms::RoomDirectory as _;
use crate::routing::{MemoryRouteTable, Route, RouteError, RouteTable};
use crate::testkit::poll;
use crate::testkit::{
    BusCall, Fault, Kit, Options, RecordingBus, RecordingOutbox, THIS_NODE, conversation_id, device_id, message,
    user_id,
};

/// The in-process route table, noting the users of every `devices_of`; an unreadable one
/// fails each `devices_of` as Redis cut off would (logins still work, so the kit's own
/// devices connect).
#[derive(Default)]
struct CountingRoutes {
    table: MemoryRouteTable,
    lookups: Mutex<Vec<Vec<UserId>>>,
    unreadable: bool,
}

impl CountingRoutes {
    fn unreadable() -> Self {
        Self { unreadable: true, ..Self::default() }
    }

    fn lookups(&self) -> Vec<Vec<UserId>> {
        self.lookups.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl RouteTable for CountingRoutes {
    async fn login(&self, route: Route) -> Result<Option<Route>, RouteError> {
        self.table.login(route).await
    }

    async fn logout(
        &self,
        user: &UserId,
        device: &DeviceId,
        node: NodeId,
        connection: ConnectionId,
    ) -> Result<bool, RouteError> {
        self.table.logout(user, device, node, connection).await
    }

    async fn devices_of(&self, users: &[UserId]) -> Result<HashMap<UserId, Vec<Route>>, RouteError> {
        self.lookups.lock().unwrap_or_else(|p| p.into_inner()).push(users.to_vec());
        if self.unreadable {
            return Err(RouteError::new("Redis did not answer route lookup within 50ms"));
        }
        self.table.devices_of(users).await
    }

    async fn restore(&self, route: Route) -> Result<bool, RouteError> {
        self.table.restore(route).await
    }

    async fn last_left(&self, user: &UserId) -> Result<Option<u64>, RouteError> {
        self.table.last_left(user).await
    }
}

/// Logs `user`'s `device` in on `node` under a connection id no session of this node has:
/// another node's connection, or (on this node) a route left behind.
async fn logged_in_on(kit: &Kit, user: &str, device: &str, node: NodeId) {
    let route = Route {
        user: user_id(user),
        device: device_id(device),
        node,
        connection: kit.connection_id(),
        connected_at_ms: 0,
        parked: false,
    };
    kit.routes.login(route).await.expect("log in");
}

/// The users of each `deliver` call, by node, each list sorted; every one of message `seq`,
/// addressed as `expected`.
fn delivered_by_node(calls: &[BusCall], seq: u64, expected: Addressed) -> BTreeMap<NodeId, Vec<String>> {
    let mut by_node = BTreeMap::new();
    for call in calls {
        if let BusCall::Deliver { node, message, users, addressed } = call {
            assert_eq!(message.seq, seq);
            assert_eq!(*addressed, expected, "{calls:?}");
            let mut users: Vec<String> = users.iter().map(ToString::to_string).collect();
            users.sort();
            assert!(by_node.insert(*node, users).is_none(), "one deliver per node: {calls:?}");
        }
    }
    by_node
}

#[tokio::test]
async fn a_direct_message_reaches_every_device_but_the_sending_one() {
    let kit = Kit::new().await;
    let (_, alice_phone) = kit.connect("alice", "phone").await;
    let (_, alice_laptop) = kit.connect("alice", "laptop").await;
    let (_, bob_phone) = kit.connect("bob", "phone").await;
    let (_, bob_tablet) = kit.connect("bob", "tablet").await;
    let (_, carol_phone) = kit.connect("carol", "phone").await;
    let sent = message("dm:alice:bob", 1, "alice", "phone");

    kit.delivery.fan_out(Arc::clone(&sent)).await;

    for (who, outbox) in [("alice/laptop", &alice_laptop), ("bob/phone", &bob_phone), ("bob/tablet", &bob_tablet)] {
        let delivered = outbox.delivered();
        assert_eq!(delivered.len(), 1, "{who} gets it once: {delivered:?}");
        assert_eq!(
            (delivered[0].id, delivered[0].seq, delivered[0].conversation.as_str()),
            (sent.id, 1, "dm:alice:bob")
        );
        assert_eq!((delivered[0].sender.as_str(), delivered[0].sender_device.as_str()), ("alice", "phone"));
    }
    assert!(alice_phone.frames().is_empty(), "the sending device has it already");
    assert!(carol_phone.frames().is_empty(), "not a member");
}

#[tokio::test]
async fn a_group_message_reaches_every_member_with_one_route_lookup() {
    let routes = Arc::new(CountingRoutes::default());
    let kit = Kit::with(Options { routes: Arc::clone(&routes) as _, ..Options::default() }).await;
    let members = [user_id("alice"), user_id("bob"), user_id("carol"), user_id("dave")];
    kit.membership.create_group(&GroupId::parse("team").expect("valid"), &members, 0).await.expect("create group");
    let (_, alice_phone) = kit.connect("alice", "phone").await;
    let (_, alice_laptop) = kit.connect("alice", "laptop").await;
    let (_, bob_phone) = kit.connect("bob", "phone").await;
    let (_, carol_phone) = kit.connect("carol", "phone").await;
    let (_, carol_tablet) = kit.connect("carol", "tablet").await;
    let (_, erin_phone) = kit.connect("erin", "phone").await;
    let before = routes.lookups().len();

    kit.delivery.fan_out(message("grp:team", 3, "alice", "phone")).await;

    for outbox in [&alice_laptop, &bob_phone, &carol_phone, &carol_tablet] {
        assert_eq!(outbox.delivered_seqs(), vec![("grp:team".to_owned(), 3)]);
    }
    assert!(alice_phone.frames().is_empty(), "the sending device has it already");
    assert!(erin_phone.frames().is_empty(), "not a member");
    let lookups = routes.lookups().split_off(before);
    assert_eq!(lookups.len(), 1, "one route lookup for every member: {lookups:?}");
    let looked_up: BTreeSet<&UserId> = lookups[0].iter().collect();
    assert_eq!(looked_up, members.iter().collect(), "every member, dave (offline) included");
}

#[tokio::test]
async fn devices_on_other_nodes_are_reached_through_the_bus_with_exactly_their_users() {
    let bus = Arc::new(RecordingBus::default());
    let kit = Kit::with(Options { bus: Arc::clone(&bus) as _, ..Options::default() }).await;
    let (two, three) = (NodeId(THIS_NODE.0 + 1), NodeId(THIS_NODE.0 + 2));
    let members = ["alice", "bob", "carol", "dave", "erin"].map(user_id);
    kit.membership.create_group(&GroupId::parse("team").expect("valid"), &members, 0).await.expect("create group");
    let (_, bob_phone) = kit.connect("bob", "phone").await;
    logged_in_on(&kit, "bob", "tablet", two).await;
    logged_in_on(&kit, "carol", "laptop", two).await;
    logged_in_on(&kit, "dave", "phone", three).await;
    logged_in_on(&kit, "alice", "laptop", three).await;
    logged_in_on(&kit, "frank", "phone", three).await; // not a member

    kit.delivery.fan_out(message("grp:team", 9, "alice", "phone")).await;

    let expected: BTreeMap<NodeId, Vec<String>> =
        [(two, vec!["bob".to_owned(), "carol".to_owned()]), (three, vec!["alice".to_owned(), "dave".to_owned()])]
            .into_iter()
            .collect();
    let calls = bus.calls();
    assert_eq!(delivered_by_node(&calls, 9, Addressed::ByRoute), expected, "{calls:?}");
    assert_eq!(calls.len(), 2, "nothing else asked of other nodes: {calls:?}");
    assert_eq!(bob_phone.delivered_seqs(), vec![("grp:team".to_owned(), 9)], "this node's device, pushed here");
}

/// A user with two devices on one other node is named once in that node's `deliver`: the
/// receiving node pushes to every device of each user it is given, and a session that is
/// live and past its backfill takes every offer, so a user named twice gets it twice.
#[tokio::test]
async fn a_user_with_two_devices_on_another_node_is_named_once() {
    let bus = Arc::new(RecordingBus::default());
    let kit = Kit::with(Options { bus: Arc::clone(&bus) as _, ..Options::default() }).await;
    let two = NodeId(THIS_NODE.0 + 1);
    logged_in_on(&kit, "bob", "phone", two).await;
    logged_in_on(&kit, "bob", "tablet", two).await;

    kit.delivery.fan_out(message("dm:alice:bob", 1, "alice", "phone")).await;

    let expected: BTreeMap<NodeId, Vec<String>> = [(two, vec!["bob".to_owned()])].into_iter().collect();
    assert_eq!(delivered_by_node(&bus.calls(), 1, Addressed::ByRoute), expected);
}

#[tokio::test]
async fn a_room_message_reaches_this_nodes_subscribers_and_the_nodes_the_directory_lists() {
    let bus = Arc::new(RecordingBus::default());
    let routes = Arc::new(CountingRoutes::default());
    let kit =
        Kit::with(Options { bus: Arc::clone(&bus) as _, routes: Arc::clone(&routes) as _, ..Options::default() }).await;
    let room = conversation_id("room:lobby");
    let (two, three) = (NodeId(THIS_NODE.0 + 1), NodeId(THIS_NODE.0 + 2));
    let (alice, alice_phone) = kit.connect("alice", "phone").await;
    let (bob, bob_phone) = kit.connect("bob", "phone").await;
    let (carol, carol_phone) = kit.connect("carol", "phone").await;
    let (_, dave_phone) = kit.connect("dave", "phone").await; // not subscribed
    for session in [&alice, &bob, &carol] {
        kit.rooms.subscribe(&room, session.id);
    }
    for node in [THIS_NODE, two, three] {
        kit.room_directory.joined(&room, node).await.expect("join");
    }
    let before = routes.lookups().len();

    let sent = message("room:lobby", 4, "alice", "phone");
    kit.delivery.fan_out(Arc::clone(&sent)).await;

    for outbox in [&bob_phone, &carol_phone] {
        assert_eq!(outbox.delivered_seqs(), vec![("room:lobby".to_owned(), 4)]);
    }
    let (bob_frames, carol_frames) = (bob_phone.shared(), carol_phone.shared());
    assert!(
        bob_frames.len() == 1 && carol_frames.len() == 1 && Arc::ptr_eq(&bob_frames[0], &carol_frames[0]),
        "one shared frame for every subscriber (encoded once for all)"
    );
    assert!(alice_phone.frames().is_empty(), "the sending device has it already");
    assert!(dave_phone.frames().is_empty(), "not subscribed");
    let calls = bus.calls();
    let [BusCall::PublishRoom { nodes, message }] = calls.as_slice() else {
        panic!("one publish_room expected, got {calls:?}")
    };
    let nodes: BTreeSet<NodeId> = nodes.iter().copied().collect();
    assert_eq!(nodes, [two, three].into_iter().collect(), "the other nodes with subscribers, not this one");
    assert_eq!(message.id, sent.id);
    assert_eq!(routes.lookups().len(), before, "rooms go by subscription, not by route");
}

#[tokio::test]
async fn a_parked_session_notes_the_message_as_owed_instead_of_pushing_it() {
    let kit = Kit::new().await;
    let (bob, bob_phone) = kit.connect("bob", "phone").await;
    let (_, bob_tablet) = kit.connect("bob", "tablet").await;
    kit.drop_within_grace(&bob).await;

    kit.delivery.fan_out(message("dm:alice:bob", 5, "alice", "phone")).await;

    assert!(bob_phone.frames().is_empty(), "a parked session is pushed nothing");
    assert_eq!(bob_tablet.delivered_seqs(), vec![("dm:alice:bob".to_owned(), 5)], "the connected device is");
    // The device comes back: what it is owed is exactly that message's conversation, from
    // its seq on.
    let back = kit.attach("bob", "phone", RecordingOutbox::new()).await;
    let parked = kit.sessions.unpark(&bob.user, &bob.device).expect("still parked");
    assert!(back.resume_from(&parked));
    let owed = back.take_resume().expect("resumed");
    assert_eq!(owed, [(conversation_id("dm:alice:bob"), 4)].into_iter().collect(), "read after seq 4");
}

/// What another node's fan-out hands this one over the bus: pushed to the named users'
/// devices here, once each, and to no one else.
#[tokio::test]
async fn a_delivery_from_another_node_reaches_only_the_named_users_devices_here() {
    let kit = Kit::new().await;
    let (_, bob_phone) = kit.connect("bob", "phone").await;
    let (_, bob_tablet) = kit.connect("bob", "tablet").await;
    let (_, carol_phone) = kit.connect("carol", "phone").await;
    let sent = message("grp:team", 7, "alice", "phone");

    kit.delivery.deliver_here(&sent, &[user_id("bob"), user_id("bob")], Addressed::ByRoute).await;

    for (who, outbox) in [("bob/phone", &bob_phone), ("bob/tablet", &bob_tablet)] {
        let seqs = outbox.delivered_seqs();
        assert_eq!(seqs, vec![("grp:team".to_owned(), 7)], "{who} gets it once");
    }
    assert!(carol_phone.frames().is_empty(), "carol was not named");
}

#[tokio::test]
async fn a_route_of_this_node_whose_connection_is_gone_is_removed_when_a_fan_out_finds_it() {
    let kit = Kit::new().await;
    let (_, bob_phone) = kit.connect("bob", "phone").await;
    // Left behind by a logout that failed (Redis down) or read from another node's cache.
    logged_in_on(&kit, "bob", "tablet", THIS_NODE).await;

    kit.delivery.fan_out(message("dm:alice:bob", 7, "alice", "phone")).await;

    assert_eq!(bob_phone.delivered_seqs(), vec![("dm:alice:bob".to_owned(), 7)], "the live device still gets it");
    wait_for_devices(&kit, "bob", &["phone"]).await;
}

/// Another node sent a delivery here for a user with no connection here: the route it
/// followed is stale, and the routes naming this node for that user are removed.
#[tokio::test]
async fn a_delivery_from_another_node_for_a_user_not_here_removes_their_stale_routes() {
    let kit = Kit::new().await;
    logged_in_on(&kit, "bob", "tablet", THIS_NODE).await;
    logged_in_on(&kit, "bob", "phone", NodeId(THIS_NODE.0 + 1)).await;

    kit.delivery.deliver_here(&message("grp:team", 7, "alice", "phone"), &[user_id("bob")], Addressed::ByRoute).await;

    wait_for_devices(&kit, "bob", &["phone"]).await;
}

/// Where the members' devices are is unknown, not absent: this node's devices get the
/// message, and every other node is asked to push it to whichever members it holds.
#[tokio::test]
async fn without_the_route_table_every_other_node_is_asked_for_every_member() {
    let (two, three) = (NodeId(THIS_NODE.0 + 1), NodeId(THIS_NODE.0 + 2));
    let bus = Arc::new(RecordingBus::with_peers(&[two, three]));
    let kit = Kit::with(Options {
        bus: Arc::clone(&bus) as _,
        routes: Arc::new(CountingRoutes::unreadable()) as _,
        ..Options::default()
    })
    .await;
    let members = ["alice", "bob", "carol"].map(user_id);
    kit.membership.create_group(&GroupId::parse("team").expect("valid"), &members, 0).await.expect("create group");
    let (_, bob_phone) = kit.connect("bob", "phone").await;

    kit.delivery.fan_out(message("grp:team", 4, "alice", "phone")).await;

    assert_eq!(bob_phone.delivered_seqs(), vec![("grp:team".to_owned(), 4)], "this node's device, pushed here");
    let calls = bus.calls();
    let asked = delivered_by_node(&calls, 4, Addressed::Everywhere);
    assert_eq!(calls.len(), 2, "nothing else asked of other nodes: {calls:?}");
    let everyone = vec!["alice".to_owned(), "bob".to_owned(), "carol".to_owned()];
    assert_eq!(asked, [(two, everyone.clone()), (three, everyone)].into_iter().collect());
}

/// A delivery sent to every node names users wherever they are: one with no session here
/// says nothing about the routes naming this node, which stay (a routed delivery for such a
/// user removes them, as above).
#[tokio::test]
async fn a_delivery_sent_to_every_node_takes_no_user_for_a_stale_route() {
    let kit = Kit::new().await;
    logged_in_on(&kit, "bob", "tablet", THIS_NODE).await;
    logged_in_on(&kit, "carol", "tablet", THIS_NODE).await;

    kit.delivery
        .deliver_here(&message("grp:team", 7, "alice", "phone"), &[user_id("bob")], Addressed::Everywhere)
        .await;
    // A routed one after it: once its clean-up has run, the first one's would have too (the
    // test's runtime runs spawned tasks in turn).
    kit.delivery.deliver_here(&message("grp:team", 8, "alice", "phone"), &[user_id("carol")], Addressed::ByRoute).await;

    wait_for_devices(&kit, "carol", &[]).await;
    let bob = kit.routes.devices_of(&[user_id("bob")]).await.expect("lookup");
    assert_eq!(bob[&user_id("bob")].len(), 1, "bob's route stays: {bob:?}");
}

/// Waits until `user`'s devices in the route table are exactly `devices`.
async fn wait_for_devices(kit: &Kit, user: &str, devices: &[&str]) {
    poll::until("the stale route to be removed", async || {
        let found = kit.routes.devices_of(&[user_id(user)]).await.expect("lookup");
        let mut names: Vec<String> =
            found.get(&user_id(user)).into_iter().flatten().map(|route| route.device.to_string()).collect();
        names.sort();
        if names == devices { Ok(()) } else { Err(format!("{names:?}")) }
    })
    .await;
}

/// A fan-out that read the route table just before a device reconnected finds its old
/// connection's route; the old session is gone from this node by then, resumed by the new
/// one. The message reaches the new session all the same (it was lost here once: offered
/// to neither session, and the new one's resumed backfill did not read that conversation).
#[tokio::test]
async fn a_route_read_before_the_device_reconnected_still_reaches_its_new_session() {
    let kit = Kit::new().await;
    let (old, old_phone) = kit.connect("bob", "phone").await;
    let old_route = Route {
        user: old.user.clone(),
        device: old.device.clone(),
        node: THIS_NODE,
        connection: old.id,
        connected_at_ms: 0,
        parked: false,
    };
    kit.drop_within_grace(&old).await;
    let new_phone = RecordingOutbox::new();
    let new = kit.attach("bob", "phone", Arc::clone(&new_phone)).await;
    let parked = kit.sessions.unpark(&new.user, &new.device).expect("parked");
    assert!(new.resume_from(&parked));
    assert_eq!(new.take_resume(), Some(BTreeMap::new()), "nothing owed when it came back");
    new.skip_backfill();
    // What the fan-out read before the new login reached the table.
    kit.routes.login(old_route).await.expect("the old route, as read");

    kit.delivery.fan_out(message("dm:alice:bob", 3, "alice", "phone")).await;

    assert_eq!(new_phone.delivered_seqs(), vec![("dm:alice:bob".to_owned(), 3)], "the new session gets it");
    assert!(old_phone.frames().is_empty(), "the old connection is closed");
}

/// Polls `done` until it holds; panics naming `what` if it never does.
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    poll::until(what, async || done()).await;
}

/// A kit whose bus records what other nodes are asked, `peers` being the other members,
/// with failed hops asked again for `retry_for_ms` and at most `max_pending` at once.
async fn kit_asking_again(peers: &[NodeId], retry_for_ms: u64, max_pending: usize) -> (Kit, Arc<RecordingBus>) {
    let bus = Arc::new(RecordingBus::with_peers(peers));
    let delivery = DeliveryConfig {
        hop_retry_for_ms: retry_for_ms,
        hop_retry_max_pending: max_pending,
        ..Options::default().delivery
    };
    let kit = Kit::with(Options { bus: Arc::clone(&bus) as _, delivery, ..Options::default() }).await;
    (kit, bus)
}

/// [`kit_asking_again`] with one other node, `two`, where bob's tablet is connected.
async fn bob_on_node_two(retry_for_ms: u64, max_pending: usize) -> (Kit, Arc<RecordingBus>, NodeId) {
    let two = NodeId(THIS_NODE.0 + 1);
    let (kit, bus) = kit_asking_again(&[two], retry_for_ms, max_pending).await;
    logged_in_on(&kit, "bob", "tablet", two).await;
    (kit, bus, two)
}

/// A node holding a recipient whose link broke is asked again until it answers: its
/// connected device would otherwise get the message only at its next sync, which a live
/// connection never makes.
#[tokio::test]
async fn a_node_that_could_not_be_asked_is_asked_again_until_it_answers() {
    let (kit, bus, two) = bob_on_node_two(60_000, 100).await;
    bus.fail_calls(two, 3, Fault::NotSent);

    kit.delivery.fan_out(message("dm:alice:bob", 5, "alice", "phone")).await;

    assert!(bus.calls().is_empty(), "the first ask failed");
    assert_eq!(kit.delivery.waiting_hops(), 1, "and waits to be asked again");
    wait_until("the hop to be asked again", || !bus.calls().is_empty()).await;
    let expected: BTreeMap<NodeId, Vec<String>> = [(two, vec!["bob".to_owned()])].into_iter().collect();
    assert_eq!(delivered_by_node(&bus.calls(), 5, Addressed::ByRoute), expected, "the same hop, once it got through");
    wait_until("its place to be given back", || kit.delivery.waiting_hops() == 0).await;
}

/// A node that left the cluster is not asked again: its devices lost their connections
/// with it, and reconnect elsewhere and backfill.
#[tokio::test]
async fn a_node_that_left_is_not_asked_again() {
    let (kit, bus, two) = bob_on_node_two(600_000, 100).await;
    bus.fail_calls(two, u32::MAX, Fault::NotSent);

    kit.delivery.fan_out(message("dm:alice:bob", 5, "alice", "phone")).await;
    assert_eq!(kit.delivery.waiting_hops(), 1);
    bus.set_peers(&[]);

    // Long before the ten minutes it may retry for.
    wait_until("the hop to be given up", || kit.delivery.waiting_hops() == 0).await;
    bus.fail_calls(two, 0, Fault::NotSent);
    assert!(bus.calls().is_empty(), "never got through: {:?}", bus.calls());
}

/// Past `hop_retry_max_pending` hops waiting, a failed one is left to its devices' next
/// sync; and with `hop_retry_for_ms = 0`, every one is.
#[tokio::test]
async fn failed_hops_wait_only_up_to_their_cap() {
    let (kit, bus, two) = bob_on_node_two(60_000, 1).await;
    bus.fail_calls(two, u32::MAX, Fault::NotSent);

    kit.delivery.fan_out(message("dm:alice:bob", 5, "alice", "phone")).await;
    kit.delivery.fan_out(message("dm:alice:bob", 6, "alice", "phone")).await;
    assert_eq!(kit.delivery.waiting_hops(), 1, "one place");
    bus.fail_calls(two, 0, Fault::NotSent);

    wait_until("the waiting hop to get through", || kit.delivery.waiting_hops() == 0).await;
    let seqs: Vec<u64> = bus
        .calls()
        .iter()
        .filter_map(|call| if let BusCall::Deliver { message, .. } = call { Some(message.seq) } else { None })
        .collect();
    assert_eq!(seqs, vec![5], "the second failed hop found no place");

    let (kit, bus, two) = bob_on_node_two(0, 100).await;
    bus.fail_calls(two, 1, Fault::NotSent);
    kit.delivery.fan_out(message("dm:alice:bob", 7, "alice", "phone")).await;
    assert_eq!(kit.delivery.waiting_hops(), 0, "retries off");
}

/// A hop that went out and was not answered in time is not asked again: the node most
/// likely pushed it late, being overloaded, and a second copy would add to its load.
#[tokio::test]
async fn a_hop_not_answered_in_time_is_not_asked_again() {
    let (kit, bus, two) = bob_on_node_two(60_000, 100).await;
    bus.fail_calls(two, 1, Fault::Late);

    kit.delivery.fan_out(message("dm:alice:bob", 5, "alice", "phone")).await;

    assert_eq!(kit.delivery.waiting_hops(), 0, "nothing waits to be asked again");
}

/// A `deliver` whose link broke after it went out is asked again: it may have landed, but
/// a session takes each seq once, so a second copy is harmless.
#[tokio::test]
async fn a_hop_whose_link_broke_after_it_went_out_is_asked_again() {
    let (kit, bus, two) = bob_on_node_two(60_000, 100).await;
    bus.fail_calls(two, 1, Fault::Broken);

    kit.delivery.fan_out(message("dm:alice:bob", 5, "alice", "phone")).await;

    assert_eq!(kit.delivery.waiting_hops(), 1, "waits to be asked again");
    wait_until("the hop to be asked again", || !bus.calls().is_empty()).await;
    let expected: BTreeMap<NodeId, Vec<String>> = [(two, vec!["bob".to_owned()])].into_iter().collect();
    assert_eq!(delivered_by_node(&bus.calls(), 5, Addressed::ByRoute), expected);
}

/// The nodes a room message was published to, in the order of the calls that got through.
fn published_to(calls: &[BusCall]) -> Vec<Vec<NodeId>> {
    calls
        .iter()
        .filter_map(|call| if let BusCall::PublishRoom { nodes, .. } = call { Some(nodes.clone()) } else { None })
        .collect()
}

/// A kit asking failed hops again, with `room:lobby` listed on this node and on `others`.
async fn room_on(others: &[NodeId]) -> (Kit, Arc<RecordingBus>) {
    let (kit, bus) = kit_asking_again(others, 60_000, 100).await;
    let room = conversation_id("room:lobby");
    for &node in others.iter().chain([&THIS_NODE]) {
        kit.room_directory.joined(&room, node).await.expect("join");
    }
    (kit, bus)
}

/// A node with room subscribers that could not be asked at all (its link would not open)
/// is asked again until it answers; the nodes that were asked are not asked twice.
#[tokio::test]
async fn a_node_with_room_subscribers_that_was_never_asked_is_asked_again() {
    let (two, three) = (NodeId(THIS_NODE.0 + 1), NodeId(THIS_NODE.0 + 2));
    let (kit, bus) = room_on(&[two, three]).await;
    bus.fail_calls(two, 2, Fault::NotSent);

    kit.delivery.fan_out(message("room:lobby", 4, "alice", "phone")).await;

    assert_eq!(published_to(&bus.calls()), vec![vec![three]], "the node that answered, once");
    assert_eq!(kit.delivery.waiting_hops(), 1, "the other waits to be asked again");
    wait_until("the room hop to get through", || published_to(&bus.calls()).len() == 2).await;
    assert_eq!(published_to(&bus.calls()), vec![vec![three], vec![two]]);
    wait_until("its place to be given back", || kit.delivery.waiting_hops() == 0).await;
}

/// A room publish that went out is never asked again, whether its link broke or its answer
/// was late: room messages are pushed once, and a subscriber's session keeps no seqs to
/// skip a second copy by.
#[tokio::test]
async fn a_room_publish_that_went_out_is_not_asked_again() {
    for fault in [Fault::Broken, Fault::Late] {
        let two = NodeId(THIS_NODE.0 + 1);
        let (kit, bus) = room_on(&[two]).await;
        bus.fail_calls(two, 1, fault);

        kit.delivery.fan_out(message("room:lobby", 4, "alice", "phone")).await;

        assert_eq!(kit.delivery.waiting_hops(), 0, "{fault:?}: nothing waits to be asked again");
        assert!(bus.calls().is_empty(), "{fault:?}: {:?}", bus.calls());
    }
}

/// A device that went on to another node: its session here, handed over, passes each
/// message that still reaches it on to that node (a hop naming the user), whether the
/// message came from a fan-out here or from another node's, and pushes nothing itself.
#[tokio::test]
async fn a_session_handed_over_to_another_node_passes_messages_on_there() {
    let two = NodeId(THIS_NODE.0 + 1);
    let bus = Arc::new(RecordingBus::with_peers(&[two]));
    let kit = Kit::with(Options { bus: Arc::clone(&bus) as _, ..Options::default() }).await;
    let (bob, bob_phone) = kit.connect("bob", "phone").await;
    kit.drop_within_grace(&bob).await;
    assert!(bob.hand_over(two).is_some(), "its backfill was over: a complete ledger");

    kit.delivery.fan_out(message("dm:alice:bob", 7, "alice", "phone")).await;
    kit.delivery
        .deliver_here(&message("dm:alice:bob", 8, "alice", "phone"), &[user_id("bob")], Addressed::ByRoute)
        .await;

    assert!(bob_phone.delivered_seqs().is_empty(), "nothing pushed to the old connection");
    let calls = bus.calls();
    let passed: Vec<(u64, NodeId, Vec<UserId>)> = calls
        .iter()
        .filter_map(|call| match call {
            BusCall::Deliver { node, message, users, addressed: Addressed::ByRoute } => {
                Some((message.seq, *node, users.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(passed, [(7, two, vec![user_id("bob")]), (8, two, vec![user_id("bob")])], "{calls:?}");
}

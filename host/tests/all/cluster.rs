//! Cluster mode's Redis seams against the machine's real Redis (`HERALD_TEST_REDIS_URL`, or
//! `redis://127.0.0.1:6379/0`): the route table, the room directory and the dedup marks,
//! each proving what its in-process twin proves, plus what only a shared store can show —
//! two nodes seeing each other's routes, a dead node's routes cleared, deadlines kept when
//! Redis stalls. Each test works under a prefix of its own and deletes its keys when done.
//! A Redis that cannot be reached fails the test, never skips it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use herald_host::breaker::{Breaker, BreakerConfig, BreakerState};
use herald_host::cluster::plugin_notices::RedisNotices;
use herald_host::cluster::{
    MarkLifetimes, RedisConnection, RedisDedup, RedisFailure, RedisRoomDirectory, RedisRouteTable, RedisTimeouts,
    RouteLifetimes, Upkeep,
};
use herald_host::maps::HashMap;
use herald_host::model::{ClientMsgId, ConnectionId, ConversationId, DeviceId, NodeId, UserId};
use herald_host::pipeline::SendError;
use herald_host::pipeline::dedup::{DedupMarks, Mark, Outcome};
use herald_host::plugins::notices::DeployNotices;
use herald_host::routing::RouteTable;
use herald_host::routing::rooms::RoomDirectory;
use herald_host::routing::{Route, RouteError};

use tokio::time::Instant;

use tokio::net::TcpListener;

use crate::redis_scratch::{Scratch, connect, partitionable_proxy};
use crate::support::poll::poll;

/// Deadlines for the tests that are not about deadlines: generous, as the machine is shared
/// by many tests at once.
const PATIENT: RedisTimeouts = RedisTimeouts { lookup: Duration::from_secs(2), write: Duration::from_secs(2) };

/// The longest anything that should happen promptly may take.
const WAIT: Duration = Duration::from_secs(5);

impl Scratch {
    fn routes(&self) -> RedisRouteTable {
        RedisRouteTable::new(self.redis.clone(), self.keys.clone(), PATIENT)
    }

    fn dedup(&self, lifetimes: MarkLifetimes) -> RedisDedup {
        RedisDedup::new(self.redis.clone(), self.keys.clone(), PATIENT, lifetimes)
    }
}

fn user(name: &str) -> UserId {
    UserId::parse(name).expect("valid user")
}

fn device(name: &str) -> DeviceId {
    DeviceId::parse(name).expect("valid device")
}

fn route(user_name: &str, device_name: &str, node: u32, connection: u64) -> Route {
    Route {
        user: user(user_name),
        device: device(device_name),
        node: NodeId(node),
        connection: ConnectionId(connection),
        connected_at_ms: 1_767_225_600_000 + connection,
        parked: false,
    }
}

fn client_msg_id(n: u32) -> ClientMsgId {
    ClientMsgId::parse(&format!("00000000-0000-4000-8000-{n:012x}")).expect("valid uuid")
}

fn dm() -> ConversationId {
    ConversationId::parse("dm:ann:bob").expect("valid")
}

fn outcome(seq: u64) -> Outcome {
    Outcome { message_id: 7_000_000_000 + seq, seq, conversation: dm() }
}

/// (node, connection) of each device of `user` in `found`, sorted.
fn places(found: &HashMap<UserId, Vec<Route>>, name: &str) -> Vec<(String, u32, u64)> {
    let mut places: Vec<_> = found
        .get(&user(name))
        .map(|routes| routes.iter().map(|r| (r.device.to_string(), r.node.0, r.connection.0)).collect())
        .unwrap_or_default();
    places.sort();
    places
}

/// Looks `user` up until a lookup answers (within [`WAIT`]): after Redis was cut off, its
/// held replies drain first, and a breaker waits out its open period.
async fn once_lookups_work_again(table: &RedisRouteTable, user: &UserId) -> HashMap<UserId, Vec<Route>> {
    poll()
        .within(WAIT)
        .every(Duration::from_millis(50))
        .until("lookups to work again", async || table.devices_of(std::slice::from_ref(user)).await)
        .await
}

#[tokio::test]
async fn login_returns_the_replaced_route_and_logout_needs_the_current_connection() {
    let scratch = Scratch::new().await;
    let table = scratch.routes();
    assert_eq!(table.login(route("ann", "phone", 0, 1)).await.expect("login"), None);
    assert_eq!(table.login(route("ann", "laptop", 0, 2)).await.expect("login"), None);
    let replaced = table.login(route("ann", "phone", 0, 3)).await.expect("login");
    assert_eq!(replaced, Some(route("ann", "phone", 0, 1)), "the whole replaced route comes back, to kick");
    let (ann, bob, phone) = (user("ann"), user("bob"), device("phone"));
    let (zero, three) = (NodeId(0), ConnectionId(3));
    assert!(!table.logout(&ann, &phone, zero, ConnectionId(1)).await.expect("logout"), "a stale connection");
    assert!(!table.logout(&ann, &phone, NodeId(1), three).await.expect("logout"), "the same id on another node");
    table.login(route("bob", "phone", 1, 1)).await.expect("login");
    let both = table.devices_of(&[ann.clone(), bob.clone()]).await.expect("devices");
    assert_eq!((both[&ann].len(), both[&bob].len()), (2, 1), "every device of every user in one lookup");
    assert!(table.logout(&ann, &phone, zero, three).await.expect("logout"));
    assert!(table.logout(&bob, &phone, NodeId(1), ConnectionId(1)).await.expect("logout"));
    let left = table.devices_of(&[ann.clone(), bob.clone()]).await.expect("devices");
    assert_eq!(left.keys().collect::<Vec<_>>(), vec![&ann], "a user with no device is absent");
    assert_eq!(places(&left, "ann"), vec![("laptop".to_owned(), 0, 2)]);
}

#[tokio::test]
async fn devices_of_returns_every_device_of_many_users_in_one_call() {
    let scratch = Scratch::new().await;
    let table = scratch.routes();
    let users: Vec<UserId> = (0..40).map(|n| user(&format!("member-{n}"))).collect();
    for (n, member) in users.iter().enumerate().filter(|(n, _)| n % 4 != 0) {
        for (d, name) in ["phone", "laptop", "web"].iter().take(n % 3 + 1).enumerate() {
            let connection = (n * 10 + d) as u64;
            table.login(route(member.as_str(), name, (n % 3) as u32, connection)).await.expect("login");
        }
    }
    let found = table.devices_of(&users).await.expect("devices");
    assert_eq!(found.len(), 30, "the ten users without a device are absent");
    for (n, member) in users.iter().enumerate() {
        let expected: Vec<(String, u32, u64)> = if n % 4 == 0 {
            Vec::new()
        } else {
            let mut expected: Vec<_> = ["phone", "laptop", "web"]
                .iter()
                .take(n % 3 + 1)
                .enumerate()
                .map(|(d, name)| ((*name).to_owned(), (n % 3) as u32, (n * 10 + d) as u64))
                .collect();
            expected.sort();
            expected
        };
        assert_eq!(places(&found, member.as_str()), expected, "{member}");
    }
    let phone = found[&users[1]].iter().find(|r| r.device.as_str() == "phone").expect("member-1's phone");
    assert_eq!(phone.connected_at_ms, 1_767_225_600_010, "the login time reads back");
    assert!(table.devices_of(&[]).await.expect("devices").is_empty());
}

#[tokio::test]
async fn two_nodes_see_each_others_routes() {
    let scratch = Scratch::new().await;
    // Two nodes: two connections of their own, one Redis.
    let first = RedisRouteTable::new(connect(&scratch.url).await, scratch.keys.clone(), PATIENT);
    let second = RedisRouteTable::new(connect(&scratch.url).await, scratch.keys.clone(), PATIENT);
    first.login(route("ann", "phone", 1, 1)).await.expect("login on node 1");
    second.login(route("ann", "laptop", 2, 1)).await.expect("login on node 2");
    second.login(route("bob", "phone", 2, 2)).await.expect("login on node 2");
    let (ann, bob) = (user("ann"), user("bob"));
    for table in [&first, &second] {
        let found = table.devices_of(&[ann.clone(), bob.clone()]).await.expect("devices");
        assert_eq!(places(&found, "ann"), vec![("laptop".to_owned(), 2, 1), ("phone".to_owned(), 1, 1)]);
        assert_eq!(places(&found, "bob"), vec![("phone".to_owned(), 2, 2)]);
    }
    // Ann's phone reconnects to node 2: node 2 learns which connection of node 1 to kick.
    let replaced = second.login(route("ann", "phone", 2, 3)).await.expect("login on node 2");
    assert_eq!(replaced, Some(route("ann", "phone", 1, 1)));
    // Node 1 closes the kicked connection; its logout must not remove the new route.
    assert!(!first.logout(&ann, &device("phone"), NodeId(1), ConnectionId(1)).await.expect("logout"));
    let found = first.devices_of(std::slice::from_ref(&ann)).await.expect("devices");
    assert_eq!(places(&found, "ann"), vec![("laptop".to_owned(), 2, 1), ("phone".to_owned(), 2, 3)]);
}

#[tokio::test]
async fn drop_node_removes_only_that_nodes_routes() {
    let scratch = Scratch::new().await;
    let table = scratch.routes();
    for n in 0..300_u64 {
        table.login(route(&format!("user-{n}"), "phone", 1, n)).await.expect("login on node 1");
    }
    table.login(route("ann", "laptop", 1, 1000)).await.expect("login on node 1");
    table.login(route("ann", "phone", 2, 1)).await.expect("login on node 2");
    table.login(route("bob", "phone", 2, 2)).await.expect("login on node 2");
    // A device that moved from node 1 to node 2: node 1's set still names it.
    table.login(route("cy", "phone", 1, 1001)).await.expect("login on node 1");
    table.login(route("cy", "phone", 2, 3)).await.expect("login on node 2");
    assert_eq!(table.drop_node(NodeId(1)).await.expect("drop node 1"), 301, "300 users and ann's laptop");
    let everyone: Vec<UserId> =
        (0..300).map(|n| user(&format!("user-{n}"))).chain(["ann", "bob", "cy"].map(user)).collect();
    let found = table.devices_of(&everyone).await.expect("devices");
    assert_eq!(found.len(), 3, "only ann, bob and cy still have routes");
    assert_eq!(places(&found, "ann"), vec![("phone".to_owned(), 2, 1)]);
    assert_eq!(places(&found, "bob"), vec![("phone".to_owned(), 2, 2)]);
    assert_eq!(places(&found, "cy"), vec![("phone".to_owned(), 2, 3)], "a moved device keeps its new route");
    assert!(!scratch.keys_written().contains("route:gw:{n:1}"), "node 1's set is gone");
    assert_eq!(table.drop_node(NodeId(1)).await.expect("drop node 1 again"), 0, "dropping is idempotent");
}

/// Routes live three heartbeats unless the node holding them refreshes them; the node's
/// upkeep keeps its connections' routes, removes those it left behind (a logout that
/// failed) on the second pass that finds them, and the routes of a node id that is no
/// longer a member once they are older than the TTL, even when the user's other devices
/// keep the hash alive. Presence learns when a user's last device left.
#[tokio::test]
async fn routes_lapse_unless_kept_and_no_ghost_outlives_its_connection() {
    let scratch = Scratch::new().await;
    let ttl = Duration::from_secs(90);
    let table = scratch.routes().with_lifetimes(RouteLifetimes { ttl });
    table.login(route("ann", "phone", 1, 1)).await.expect("login");
    let lives = scratch.ttl_ms("route:{u:ann}");
    assert!(lives > 80_000 && lives <= 90_000, "a login gives the hash its TTL: {lives} ms");

    // Node 1 holds ann's phone; bob's route was left behind by a logout that failed.
    table.login(route("bob", "phone", 1, 2)).await.expect("login");
    // ann's laptop on node 9, which stopped with the rest of an earlier cluster and never
    // came back: a route from before the TTL.
    let mut ghost = route("ann", "laptop", 9, 5);
    ghost.connected_at_ms = 1_000;
    table.login(ghost).await.expect("a route of the earlier cluster");
    let holds = |user: &UserId, connection: ConnectionId| user.as_str() == "ann" && connection == ConnectionId(1);
    let mut suspects = std::collections::HashSet::new();
    let first = table.keep_alive(NodeId(1), &[NodeId(1), NodeId(2)], holds, &mut suspects).await.expect("upkeep");
    assert_eq!(first, Upkeep { refreshed: 1, left_behind: 0, of_departed_nodes: 1 });
    let found = table.devices_of(&[user("ann"), user("bob")]).await.expect("lookup");
    assert_eq!(places(&found, "ann"), vec![("phone".to_owned(), 1, 1)], "the departed node's route is gone");
    assert_eq!(places(&found, "bob"), vec![("phone".to_owned(), 1, 2)], "one pass is not enough to remove");

    let second = table.keep_alive(NodeId(1), &[NodeId(1), NodeId(2)], holds, &mut suspects).await.expect("upkeep");
    assert_eq!(second, Upkeep { refreshed: 1, left_behind: 1, of_departed_nodes: 0 });
    let found = table.devices_of(&[user("ann"), user("bob")]).await.expect("lookup");
    assert!(!found.contains_key(&user("bob")), "the route left behind is removed on the second pass");
    assert!(found.contains_key(&user("ann")), "the held one stays");
    assert!(scratch.ttl_ms("route:gw:{n:1}") > 0, "the node's set lapses too unless the node lives");
    let seen = table.last_left(&user("bob")).await.expect("last seen").expect("bob left");
    let now =
        u64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after").as_millis())
            .expect("fits");
    assert!(now.abs_diff(seen) < 60_000, "when bob's last device left: {seen}, now {now}");
    assert_eq!(table.last_left(&user("ann")).await.expect("last seen"), None, "ann never left");
}

#[tokio::test]
async fn a_dedup_mark_is_fresh_once_then_in_flight_then_stored() {
    let scratch = Scratch::new().await;
    let dedup = scratch.dedup(MarkLifetimes::with_ttl(Duration::from_secs(60)));
    // A second node's marks: a retry that reaches another owner sees the same mark.
    let other = RedisDedup::new(
        connect(&scratch.url).await,
        scratch.keys.clone(),
        PATIENT,
        MarkLifetimes::with_ttl(Duration::from_secs(60)),
    );
    let (ann, id) = (user("ann"), client_msg_id(1));
    assert!(matches!(dedup.try_mark(&ann, &id, &dm()).await, Mark::Fresh));
    let Mark::InFlight(waiting) = other.try_mark(&ann, &id, &dm()).await else { panic!("in flight") };
    let waiting = tokio::spawn(waiting);
    dedup.complete(&ann, &id, outcome(3)).await;
    let answered = tokio::time::timeout(WAIT, waiting).await.expect("the waiter answers").expect("joined");
    assert_eq!(answered, Ok(outcome(3)), "a duplicate in flight gets the original's ids");
    assert!(matches!(other.try_mark(&ann, &id, &dm()).await, Mark::Stored(o) if o == outcome(3)));
    dedup.cancel(&ann, &id).await;
    assert!(matches!(dedup.try_mark(&ann, &id, &dm()).await, Mark::Stored(_)), "cancel never removes a stored mark");
    assert!(matches!(dedup.try_mark(&user("bob"), &id, &dm()).await, Mark::Fresh), "marks are per sender");
}

#[tokio::test]
async fn a_cancelled_mark_fails_its_waiters_and_lets_the_retry_through() {
    let scratch = Scratch::new().await;
    let dedup = scratch.dedup(MarkLifetimes::with_ttl(Duration::from_secs(60)));
    let (ann, id) = (user("ann"), client_msg_id(2));
    assert!(matches!(dedup.try_mark(&ann, &id, &dm()).await, Mark::Fresh));
    let Mark::InFlight(waiting) = dedup.try_mark(&ann, &id, &dm()).await else { panic!("in flight") };
    let waiting = tokio::spawn(waiting);
    dedup.cancel(&ann, &id).await;
    let answered = tokio::time::timeout(WAIT, waiting).await.expect("the waiter answers").expect("joined");
    assert_eq!(answered, Err(SendError::OriginalFailed));
    assert!(matches!(dedup.try_mark(&ann, &id, &dm()).await, Mark::Fresh), "a cancelled mark lets the retry through");
}

#[tokio::test]
async fn dedup_marks_expire_after_their_ttl() {
    let scratch = Scratch::new().await;
    let ttl = Duration::from_millis(200);
    let dedup = scratch.dedup(MarkLifetimes::with_ttl(ttl));
    let ann = user("ann");
    // A pending mark whose send never ends, then a stored one.
    for (n, complete) in [(3, false), (4, true)] {
        let id = client_msg_id(n);
        let taken = Instant::now();
        assert!(matches!(dedup.try_mark(&ann, &id, &dm()).await, Mark::Fresh));
        if complete {
            dedup.complete(&ann, &id, outcome(5)).await;
            assert!(matches!(dedup.try_mark(&ann, &id, &dm()).await, Mark::Stored(_)));
        }
        poll()
            .within(WAIT)
            .every(Duration::from_millis(20))
            .until("the mark to expire", async || matches!(dedup.try_mark(&ann, &id, &dm()).await, Mark::Fresh))
            .await;
        assert!(taken.elapsed() >= ttl - Duration::from_millis(20), "expired early: {:?}", taken.elapsed());
    }
}

#[tokio::test]
async fn a_duplicate_stops_waiting_for_an_original_that_never_ends() {
    let scratch = Scratch::new().await;
    let lifetimes = MarkLifetimes {
        ttl: Duration::from_secs(60),
        pending_ttl: Duration::from_secs(60),
        wait_for_original: Duration::from_millis(150),
    };
    let dedup = scratch.dedup(lifetimes);
    let (ann, id) = (user("ann"), client_msg_id(6));
    assert!(matches!(dedup.try_mark(&ann, &id, &dm()).await, Mark::Fresh));
    let Mark::InFlight(waiting) = dedup.try_mark(&ann, &id, &dm()).await else { panic!("in flight") };
    let started = Instant::now();
    assert_eq!(waiting.await, Err(SendError::OriginalAbandoned));
    assert!(started.elapsed() < Duration::from_secs(1), "waited {:?}", started.elapsed());
}

#[tokio::test]
async fn the_room_directory_lists_a_node_between_joined_and_left() {
    let scratch = Scratch::new().await;
    let rooms = RedisRoomDirectory::new(scratch.redis.clone(), scratch.keys.clone(), PATIENT);
    let other_node = RedisRoomDirectory::new(connect(&scratch.url).await, scratch.keys.clone(), PATIENT);
    let lobby = ConversationId::parse("room:lobby").expect("valid");
    let arena = ConversationId::parse("room:arena").expect("valid");
    let sorted = |mut nodes: Vec<NodeId>| {
        nodes.sort();
        nodes
    };
    assert!(rooms.nodes(&lobby).await.expect("nodes").is_empty());
    rooms.joined(&lobby, NodeId(1)).await.expect("joined");
    other_node.joined(&lobby, NodeId(2)).await.expect("joined");
    rooms.joined(&lobby, NodeId(1)).await.expect("joining twice is harmless");
    rooms.joined(&arena, NodeId(3)).await.expect("joined");
    assert_eq!(sorted(other_node.nodes(&lobby).await.expect("nodes")), vec![NodeId(1), NodeId(2)]);
    rooms.left(&lobby, NodeId(1)).await.expect("left");
    assert_eq!(rooms.nodes(&lobby).await.expect("nodes"), vec![NodeId(2)]);
    other_node.left(&lobby, NodeId(2)).await.expect("left");
    assert!(rooms.nodes(&lobby).await.expect("nodes").is_empty());
    assert_eq!(rooms.nodes(&arena).await.expect("nodes"), vec![NodeId(3)], "other rooms are untouched");
}

#[tokio::test]
async fn keys_follow_the_documented_layout() {
    let scratch = Scratch::new().await;
    scratch.routes().login(route("ann", "phone", 4, 9)).await.expect("login");
    let rooms = RedisRoomDirectory::new(scratch.redis.clone(), scratch.keys.clone(), PATIENT);
    rooms.joined(&ConversationId::parse("room:lobby").expect("valid"), NodeId(4)).await.expect("joined");
    let dedup = scratch.dedup(MarkLifetimes::with_ttl(Duration::from_secs(600)));
    assert!(matches!(dedup.try_mark(&user("ann"), &client_msg_id(7), &dm()).await, Mark::Fresh));
    let mark = "dedup:{u:ann}:00000000-0000-4000-8000-000000000007";
    let expected: BTreeSet<String> =
        ["route:{u:ann}", "route:gw:{n:4}", "room:{r:lobby}:nodes", mark].map(str::to_owned).into();
    assert_eq!(scratch.keys_written(), expected);
    let pending_ttl = scratch.ttl_ms(mark);
    assert!((1..=10_000).contains(&pending_ttl), "a pending mark lives at most 10 s: {pending_ttl} ms");
    dedup.complete(&user("ann"), &client_msg_id(7), outcome(1)).await;
    let stored_ttl = scratch.ttl_ms(mark);
    assert!((30_001..=600_000).contains(&stored_ttl), "a stored mark lives the dedup TTL: {stored_ttl} ms");
    let route_ttl = scratch.ttl_ms("route:{u:ann}");
    assert!((1..=90_000).contains(&route_ttl), "routes live three heartbeats unless refreshed: {route_ttl} ms");
}

#[tokio::test]
async fn a_stalled_redis_fails_each_call_within_its_deadline() {
    let scratch = Scratch::new().await;
    let frozen = Arc::new(AtomicBool::new(false));
    let redis = connect(&partitionable_proxy(&scratch.url, Arc::clone(&frozen)).await).await;
    let timeouts = RedisTimeouts { lookup: Duration::from_millis(50), write: Duration::from_millis(100) };
    let table = RedisRouteTable::new(redis.clone(), scratch.keys.clone(), timeouts);
    let rooms = RedisRoomDirectory::new(redis.clone(), scratch.keys.clone(), timeouts);
    let dedup =
        RedisDedup::new(redis, scratch.keys.clone(), timeouts, MarkLifetimes::with_ttl(Duration::from_secs(60)));
    let (ann, lobby) = (user("ann"), ConversationId::parse("room:lobby").expect("valid"));
    table.login(route("ann", "phone", 1, 1)).await.expect("login while Redis answers");

    frozen.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let lookup = redis_failure(table.devices_of(std::slice::from_ref(&ann)).await.expect_err("a stalled lookup fails"));
    assert_eq!(lookup, "Redis did not answer route lookup within 50ms");
    let login = redis_failure(table.login(route("ann", "laptop", 1, 2)).await.expect_err("a stalled login fails"));
    assert!(login.contains("Redis") && login.contains("route login"), "{login}");
    let nodes = redis_failure(rooms.nodes(&lobby).await.expect_err("a stalled room lookup fails"));
    assert!(nodes.contains("room nodes lookup"), "{nodes}");
    assert!(
        matches!(dedup.try_mark(&ann, &client_msg_id(8), &dm()).await, Mark::Fresh),
        "a mark that cannot be taken lets the send through to the unique index"
    );
    dedup.complete(&ann, &client_msg_id(8), outcome(1)).await;
    assert!(started.elapsed() < Duration::from_secs(2), "the calls took {:?}", started.elapsed());

    // Once Redis answers again, so does the same connection (its first answers may still
    // be late on a busy machine: the held replies drain first).
    frozen.store(false, Ordering::SeqCst);
    let found = once_lookups_work_again(&table, &ann).await;
    assert_eq!(places(&found, "ann"), vec![("phone".to_owned(), 1, 1)]);
}

/// What Redis did, from the cause a route error keeps: the Redis failure itself, not a copy
/// of its text.
fn redis_failure(error: RouteError) -> String {
    error.cause().downcast_ref::<RedisFailure>().expect("the cause is Redis's failure").to_string()
}

#[tokio::test]
async fn a_redis_that_keeps_failing_opens_the_breaker_then_calls_fail_at_once_until_it_answers_again() {
    let scratch = Scratch::new().await;
    let frozen = Arc::new(AtomicBool::new(false));
    let breaker = Breaker::new(
        "redis",
        BreakerConfig { failures: 3, span: Duration::ZERO, open_for: Duration::from_millis(300) },
    );
    let redis =
        connect(&partitionable_proxy(&scratch.url, Arc::clone(&frozen)).await).await.with_breaker(breaker.clone());
    let timeouts = RedisTimeouts { lookup: Duration::from_millis(50), write: Duration::from_secs(2) };
    let table = RedisRouteTable::new(redis.clone(), scratch.keys.clone(), timeouts);
    let dedup =
        RedisDedup::new(redis, scratch.keys.clone(), timeouts, MarkLifetimes::with_ttl(Duration::from_secs(60)));
    let ann = user("ann");
    table.login(route("ann", "phone", 1, 1)).await.expect("login while Redis answers");

    frozen.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let lookup = redis_failure(table.devices_of(std::slice::from_ref(&ann)).await.expect_err("stalled"));
        assert_eq!(lookup, "Redis did not answer route lookup within 50ms");
    }
    assert_eq!(breaker.state(), BreakerState::Open, "three timeouts in a row");
    let refused = redis_failure(table.devices_of(std::slice::from_ref(&ann)).await.expect_err("not even tried"));
    assert_eq!(refused, "Redis was not asked for route lookup: its circuit breaker is open after repeated failures");
    assert!(
        matches!(dedup.try_mark(&ann, &client_msg_id(9), &dm()).await, Mark::Fresh),
        "with the breaker open a send still goes through, to the unique index"
    );
    assert!(breaker.status().refused >= 2, "{:?}", breaker.status());

    // Once Redis answers, the probe after the open period closes the breaker again.
    frozen.store(false, Ordering::SeqCst);
    let found = once_lookups_work_again(&table, &ann).await;
    assert_eq!(places(&found, "ann"), vec![("phone".to_owned(), 1, 1)]);
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test]
async fn an_unreachable_redis_fails_to_connect_with_a_clear_message() {
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("address");
    let url = format!("redis://:secret@{closed}/0");
    let started = Instant::now();
    let error = RedisConnection::connect(&url, Duration::from_millis(500)).await.err().expect("nothing listens there");
    let message = error.to_string();
    assert!(message.starts_with(&format!("cannot connect to Redis at redis://***@{closed}/0")), "{message}");
    assert!(!message.contains("secret"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
}

/// The client URLs draining nodes read: one hash of the `{cluster}` tag, a node's entry
/// replaced when the id is taken again and gone once withdrawn.
#[tokio::test]
async fn client_urls_are_published_replaced_and_withdrawn_per_node() {
    let scratch = Scratch::new().await;
    let urls = herald_host::cluster::ClientUrls::new(scratch.redis.clone(), scratch.keys.clone(), PATIENT);
    assert!(urls.all().await.expect("read").is_empty(), "nothing published yet");
    urls.publish(NodeId(1), "ws://127.0.0.1:7070/v1/ws").await.expect("publish");
    urls.publish(NodeId(2), "ws://127.0.0.1:7080/v1/ws").await.expect("publish");
    urls.publish(NodeId(1), "wss://node-1.example.com/v1/ws").await.expect("a new life of node 1");
    let all = urls.all().await.expect("read");
    let expected = [(NodeId(1), "wss://node-1.example.com/v1/ws"), (NodeId(2), "ws://127.0.0.1:7080/v1/ws")];
    assert_eq!(all.iter().map(|(node, url)| (*node, url.as_str())).collect::<Vec<_>>(), expected);
    assert_eq!(scratch.keys_written(), BTreeSet::from(["node:{cluster}:clients".to_owned()]));
    urls.withdraw(NodeId(1)).await.expect("withdraw");
    urls.withdraw(NodeId(1)).await.expect("withdrawing twice is no error");
    assert_eq!(urls.all().await.expect("read").into_keys().collect::<Vec<_>>(), vec![NodeId(2)]);
}

/// A plugin deploy announced on one node wakes every other node's follower through Redis,
/// and a node's subscription ends with the node: one stopped (or a test's node dropped)
/// leaves no connection behind. On a Redis Cluster nodes follow by their poll alone and
/// nothing subscribes.
#[tokio::test]
async fn deploy_notices_reach_the_other_nodes_and_each_subscription_ends_with_its_node() {
    let scratch = Scratch::new().await;
    let channel = format!("{}plugins:deployed", scratch.keys.as_str());
    let announcing = RedisNotices::start(scratch.redis.clone(), &scratch.keys, &scratch.url, true);
    let hearing = RedisNotices::start(scratch.redis.clone(), &scratch.keys, &scratch.url, true);
    let mut heard = hearing.subscribe();
    if scratch.url.starts_with("redis+cluster://") {
        let own = announcing.subscribe();
        announcing.announce().await;
        assert!(own.has_changed().expect("open"), "a node hears its own notice without Redis");
        assert_eq!(scratch.subscribers(&channel), 0, "nothing subscribes on a Redis Cluster");
        return;
    }
    poll().until("both nodes to subscribe", async || scratch.subscribers(&channel) == 2).await;
    // Each subscription counts itself as a notice once (one may have been missed while it
    // was down): wait for that, so what comes next can only be the other node's.
    poll().until("the subscription's own notice", async || *heard.borrow() >= 1).await;
    let before = *heard.borrow_and_update();
    announcing.announce().await;
    tokio::time::timeout(WAIT, heard.wait_for(|&count| count > before))
        .await
        .expect("the other node hears the notice through Redis")
        .expect("the notices are open");
    drop((announcing, hearing));
    poll().until("every subscription to end with its node", async || scratch.subscribers(&channel) == 0).await;
}

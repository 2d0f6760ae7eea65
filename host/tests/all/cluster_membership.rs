//! Cluster membership against the machine's real Redis (`HERALD_TEST_REDIS_URL`, or
//! `redis://127.0.0.1:6379/0`): nodes leasing ids, seeing each other at one epoch with one
//! ring, leaving, lapsing — and fencing themselves before anyone else can see the lapse.
//! Leases are short (600 ms, renewed every 150 ms, the view read every 50 ms) and every
//! wait is a poll with a generous bound, never a fixed sleep. Each test works under a
//! prefix of its own and deletes its keys when done; a Redis that cannot be reached fails
//! the test, never skips it.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use herald_host::cluster::membership::{JoinError, MembershipSettings, RedisMembership};
use herald_host::config::Placement;
use herald_host::model::NodeId;
use herald_host::routing::placement::Homes;
use herald_host::routing::topology::Topology;

use crate::redis_scratch::{Scratch, connect, partitionable_proxy};
use crate::support::poll::poll;

/// The longest anything that should happen promptly may take.
const WAIT: Duration = Duration::from_secs(5);

/// What node `n` of a test advertises.
fn address(n: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7100 + n))
}

/// Short leases, so lapses take well under a second.
fn settings(n: u16) -> MembershipSettings {
    MembershipSettings {
        heartbeat: Duration::from_millis(150),
        poll: Duration::from_millis(50),
        ..MembershipSettings::new(address(n)).with_lease_ttl(Duration::from_millis(600))
    }
}

impl Scratch {
    /// A node with `settings`, on a connection of its own.
    async fn try_join(&self, settings: MembershipSettings) -> Result<Arc<RedisMembership>, JoinError> {
        RedisMembership::join(connect(&self.url).await, self.keys.clone(), settings).await
    }

    /// Node `n` of the test, with the test's settings.
    async fn join(&self, n: u16) -> Arc<RedisMembership> {
        self.try_join(settings(n)).await.unwrap_or_else(|error| panic!("node {n} could not join: {error}"))
    }
}

/// Leaves with every node, so that none writes after the test deletes its keys (once a
/// leave is answered, nothing sent before it on that connection is still to run, and no
/// renew follows it).
async fn leave_all(nodes: &[&Arc<RedisMembership>]) {
    for node in nodes {
        node.leave().await.expect("leave");
    }
}

/// Polls `condition` until it holds, failing the test with `what` after [`WAIT`].
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    poll().within(WAIT).every(Duration::from_millis(5)).until(what, async || condition()).await;
}

/// The nodes on `node`'s ring.
fn ring(node: &RedisMembership) -> Vec<u32> {
    node.view().ring.nodes()
}

/// The node ids of `nodes`, sorted.
fn ids(nodes: &[&Arc<RedisMembership>]) -> Vec<u32> {
    let mut ids: Vec<u32> = nodes.iter().map(|node| node.this_node().0).collect();
    ids.sort_unstable();
    ids
}

/// Whether every one of `nodes` has all of them on its ring, at one epoch.
fn agree(nodes: &[&Arc<RedisMembership>]) -> bool {
    let expected = ids(nodes);
    let epoch = nodes[0].view().epoch;
    nodes.iter().all(|node| {
        let view = node.view();
        view.epoch == epoch && view.ring.nodes() == expected
    })
}

fn sample_keys() -> impl Iterator<Item = String> {
    (0..1000).map(|i| format!("dm:user-{i}:user-{}", i * 7 + 1))
}

#[tokio::test]
async fn two_nodes_that_join_see_each_other_at_one_epoch_with_one_ring() {
    let scratch = Scratch::new().await;
    let (a, b) = (scratch.join(1).await, scratch.join(2).await);
    assert_ne!(a.this_node(), b.this_node());
    eventually("both nodes on both rings at one epoch", || agree(&[&a, &b])).await;
    let (on_a, on_b) = (a.view(), b.view());
    let mut owned = BTreeSet::new();
    for key in sample_keys() {
        let owner = on_a.owner(&key);
        assert_eq!(owner, on_b.owner(&key), "the nodes disagree on who owns {key}");
        owned.extend(owner);
    }
    assert_eq!(owned, [a.this_node(), b.this_node()].into(), "keys spread over both nodes");
    let mut members = vec![(a.this_node(), address(1)), (b.this_node(), address(2))];
    members.sort();
    assert_eq!(a.members(), members);
    assert_eq!(b.members(), members);
    assert_eq!(*a.subscribe().borrow(), on_a.epoch, "subscribers see the epoch in force");
    assert!(a.holds_lease() && b.holds_lease());
    assert!(!*a.fenced().borrow());
    let expected: BTreeSet<String> = ["leases", "holders", "epoch", "generation", "settings"]
        .iter()
        .map(|name| format!("node:{{cluster}}:{name}"))
        .collect();
    assert_eq!(scratch.keys_written(), expected, "the documented key layout");
    leave_all(&[&a, &b]).await;
}

#[tokio::test]
async fn a_third_node_raises_the_epoch_and_takes_keys_only_for_itself() {
    let scratch = Scratch::new().await;
    let (a, b) = (scratch.join(1).await, scratch.join(2).await);
    eventually("two nodes agree", || agree(&[&a, &b])).await;
    let before = a.view();
    let epochs = a.subscribe();
    let c = scratch.join(3).await;
    eventually("three nodes agree", || agree(&[&a, &b, &c])).await;
    let after = b.view();
    assert!(after.epoch > before.epoch, "epoch {} after {}", after.epoch, before.epoch);
    assert!(epochs.has_changed().expect("the membership is alive"), "subscribers learn of the new epoch");
    let third = c.this_node();
    let mut moved = 0;
    for key in sample_keys() {
        let (old, new) = (before.owner(&key), after.owner(&key));
        if old != new {
            assert_eq!(new, Some(third), "{key} moved from {old:?} to {new:?}, not to the joining node");
            moved += 1;
        }
    }
    assert!((1..600).contains(&moved), "{moved} of 1000 keys moved to the third node");
    leave_all(&[&a, &b, &c]).await;
}

#[tokio::test]
async fn a_node_that_leaves_disappears_from_the_others_views() {
    let scratch = Scratch::new().await;
    let (a, b, c) = (scratch.join(1).await, scratch.join(2).await, scratch.join(3).await);
    eventually("three nodes agree", || agree(&[&a, &b, &c])).await;
    let before = a.view().epoch;
    c.leave().await.expect("leave");
    assert!(!c.holds_lease() && *c.fenced().borrow(), "a node that left holds no lease");
    assert!(!ring(&c).contains(&c.this_node().0), "the leaving node's own ring is without it");
    assert!(c.view().epoch > before);
    eventually("the others' rings without the node that left", || agree(&[&a, &b])).await;
    assert!(a.view().epoch > before);
    assert!(a.members().iter().all(|(node, _)| *node != c.this_node()), "no longer a member");
    // Still reached at its last address for a while (a view may lack a live node while the
    // leases are re-asserted after Redis lost its data); a node that is gone fails at connect.
    assert_eq!(a.address_of(c.this_node()), Some(address(3)));
    c.leave().await.expect("leaving twice does nothing");
    leave_all(&[&a, &b]).await;
}

#[tokio::test]
async fn a_node_whose_heartbeats_stop_is_fenced_before_the_others_drop_it() {
    let scratch = Scratch::new().await;
    let (a, b) = (scratch.join(1).await, scratch.join(2).await);
    eventually("two nodes agree", || agree(&[&a, &b])).await;
    let fenced = b.fenced();
    b.pause_heartbeats();
    let gone = b.this_node().0;
    // Read a's ring first: once it lacks b, b must already have stopped acting for its lease.
    eventually("the node whose heartbeats stopped to be dropped", || !ring(&a).contains(&gone)).await;
    assert!(!b.holds_lease(), "the others dropped the node while it still held its lease");
    assert!(*fenced.borrow(), "the node was not told it is fenced before the others dropped it");
    assert!(a.holds_lease(), "a node that renews keeps its lease across many TTLs");
    assert_eq!(ring(&a), vec![a.this_node().0]);
    eventually("the fenced node's own view catches up", || ring(&b) == vec![a.this_node().0]).await;
    leave_all(&[&a]).await;
}

#[tokio::test]
async fn a_node_dropped_without_leaving_is_removed_once_its_lease_lapses() {
    let scratch = Scratch::new().await;
    let (a, b) = (scratch.join(1).await, scratch.join(2).await);
    eventually("two nodes agree", || agree(&[&a, &b])).await;
    let (gone, before) = (b.this_node(), a.view().epoch);
    drop(b);
    eventually("the dropped node off the ring", || !ring(&a).contains(&gone.0)).await;
    assert!(a.view().epoch > before, "a lapse is a new epoch");
    assert!(a.members().iter().all(|(node, _)| *node != gone), "no longer a member");
    let again = scratch.join(3).await;
    assert_eq!(again.this_node(), gone, "a lapsed id is free again, and the lowest");
    leave_all(&[&a, &again]).await;
}

#[tokio::test]
async fn concurrent_joins_lease_distinct_ids() {
    let scratch = Scratch::new().await;
    let nodes: Vec<Arc<RedisMembership>> = join_all((1..=5).map(|n| scratch.join(n))).await;
    let refs: Vec<&Arc<RedisMembership>> = nodes.iter().collect();
    assert_eq!(ids(&refs), vec![0, 1, 2, 3, 4], "five distinct ids, the lowest free");
    eventually("five nodes agree", || agree(&refs)).await;
    leave_all(&refs).await;
}

#[tokio::test]
async fn a_pinned_id_held_by_a_live_node_is_refused_until_the_holder_leaves() {
    let scratch = Scratch::new().await;
    let pinned = |n| MembershipSettings { pinned: Some(NodeId(7)), ..settings(n) };
    let holder = scratch.try_join(pinned(1)).await.expect("the first node takes id 7");
    assert_eq!(holder.this_node(), NodeId(7));
    let refused = scratch.try_join(pinned(2)).await.err().expect("id 7 is held");
    let message = refused.to_string();
    assert!(matches!(&refused, JoinError::Clash { node: NodeId(7), holder } if *holder == address(1).to_string()));
    assert!(message.contains("127.0.0.1:7101") && message.contains("lease lapses"), "{message}");
    let other = scratch.join(3).await;
    assert_eq!(other.this_node(), NodeId(0), "an unpinned node takes the lowest free id");
    holder.leave().await.expect("leave");
    let second = scratch.try_join(pinned(2)).await.expect("id 7 is free once its holder left");
    assert_eq!(second.this_node(), NodeId(7));
    leave_all(&[&other, &second]).await;
}

#[tokio::test]
async fn address_of_returns_the_advertised_address() {
    let scratch = Scratch::new().await;
    let a = scratch.join(1).await;
    let v6: SocketAddr = "[::1]:7102".parse().expect("valid");
    let b = scratch
        .try_join(MembershipSettings { advertise: v6, ..settings(2) })
        .await
        .expect("a node advertising an IPv6 address");
    assert_eq!(b.address_of(b.this_node()), Some(v6), "a node knows its own address from its join");
    eventually("a learns b's address", || a.address_of(b.this_node()) == Some(v6)).await;
    assert_eq!(a.address_of(a.this_node()), Some(address(1)));
    assert_eq!(a.address_of(NodeId(999)), None);
    leave_all(&[&a, &b]).await;
}

#[tokio::test]
async fn a_node_cut_off_from_redis_fences_itself_and_keeps_its_last_view() {
    let scratch = Scratch::new().await;
    let cut = Arc::new(AtomicBool::new(false));
    let through = connect(&partitionable_proxy(&scratch.url, Arc::clone(&cut)).await).await;
    let a = scratch.join(1).await;
    let b = RedisMembership::join(through, scratch.keys.clone(), settings(2)).await.expect("join through the proxy");
    eventually("two nodes agree", || agree(&[&a, &b])).await;
    let both = ring(&b);
    let fenced = b.fenced();
    cut.store(true, Ordering::SeqCst);
    eventually("the cut-off node to be dropped", || !ring(&a).contains(&b.this_node().0)).await;
    assert!(!b.holds_lease(), "the others dropped the cut-off node while it still held its lease");
    assert!(*fenced.borrow(), "the cut-off node did not fence itself first");
    assert_eq!(ring(&b), both, "a node that cannot reach Redis keeps its last view");
    // Reconnected, its renews (some sent long ago, held up on the way) find the lease lapsed:
    // it stays fenced, and its view catches up.
    cut.store(false, Ordering::SeqCst);
    eventually("the reconnected node's view catches up", || ring(&b) == vec![a.this_node().0]).await;
    assert!(!b.holds_lease() && *fenced.borrow());
    leave_all(&[&a]).await;
    drop(b);
}

#[tokio::test]
async fn nodes_reassert_their_leases_after_redis_lost_its_data() {
    let scratch = Scratch::new().await;
    let (a, b) = (scratch.join(1).await, scratch.join(2).await);
    eventually("two nodes agree", || agree(&[&a, &b])).await;
    let before = a.view().epoch;
    // What FLUSHALL does to this deployment's keys.
    scratch.forget_everything();
    eventually("both nodes back on both rings, at a later epoch", || agree(&[&a, &b]) && a.view().epoch > before).await;
    assert!(a.holds_lease() && b.holds_lease(), "a lease Redis forgot is re-asserted, not lost");
    let newcomer = scratch.join(3).await;
    assert_eq!(newcomer.this_node(), NodeId(2), "the re-asserted ids are taken again");
    leave_all(&[&a, &b, &newcomer]).await;
}

/// A cluster restarted on a Redis that lost its data counts epochs from the database's
/// highest owner epoch (the join's floor), not from zero; a floor below the count in force
/// changes nothing.
#[tokio::test]
async fn a_join_counts_epochs_from_its_floor_and_never_below_the_count_in_force() {
    let scratch = Scratch::new().await;
    let first = scratch.try_join(MembershipSettings { epoch_floor: 1_000, ..settings(1) }).await.expect("join");
    assert_eq!(first.view().epoch, 1_001, "the first ring is newer than any owner the database names");
    let second = scratch.try_join(MembershipSettings { epoch_floor: 3, ..settings(2) }).await.expect("join");
    eventually("both nodes agree", || agree(&[&first, &second])).await;
    assert_eq!(second.view().epoch, 1_002, "a lower floor does not take the count back");
    leave_all(&[&first, &second]).await;
}

#[tokio::test]
async fn joining_through_a_redis_that_does_not_answer_fails_with_a_redis_error() {
    let scratch = Scratch::new().await;
    let cut = Arc::new(AtomicBool::new(false));
    let through = connect(&partitionable_proxy(&scratch.url, Arc::clone(&cut)).await).await;
    cut.store(true, Ordering::SeqCst);
    let error = RedisMembership::join(through, scratch.keys.clone(), settings(1)).await.err().expect("no answer");
    assert!(matches!(error, JoinError::Redis(_)), "{error}");
    let message = error.to_string();
    assert!(message.starts_with("cannot join the cluster: Redis did not answer membership join"), "{message}");
}

/// Node `n` with placement: clients reach it at `127.0.0.1:<7200 + n>`.
fn placed(n: u16, placement: Placement) -> MembershipSettings {
    MembershipSettings { placement, client: Some(format!("127.0.0.1:{}", 7200 + n)), ..settings(n) }
}

#[tokio::test]
async fn every_node_names_the_homes_nginx_would_over_the_members_client_addresses() {
    let scratch = Scratch::new().await;
    let join = |n| scratch.try_join(placed(n, Placement::NginxConsistent));
    let (a, b) = (join(1).await.expect("a joins"), join(2).await.expect("b joins"));
    eventually("two nodes agree", || agree(&[&a, &b])).await;
    let users: Vec<String> = (0..1000).map(|i| format!("user-{i}")).collect();
    let homes_of = |node: &Arc<RedisMembership>| {
        let view = node.view();
        users.iter().map(|user| view.home(user)).collect::<Vec<_>>()
    };
    // The upstream nginx would be given: the client addresses in the order of node ids.
    let mut upstream = vec![(a.this_node(), "127.0.0.1:7201".to_owned()), (b.this_node(), "127.0.0.1:7202".to_owned())];
    upstream.sort();
    let expected = Homes::new(Placement::NginxConsistent, upstream.clone());
    assert_eq!(a.view().homes.upstream(), upstream.as_slice());
    assert_eq!(a.view().homes.digest(), expected.digest());
    assert_eq!(homes_of(&a), users.iter().map(|user| expected.home(user)).collect::<Vec<_>>());
    assert_eq!(homes_of(&a), homes_of(&b), "both nodes name the same homes");
    let before = homes_of(&a);

    // A third node: the users that move, move to it; the homes are those of the new upstream.
    let c = join(3).await.expect("c joins");
    eventually("three nodes agree", || agree(&[&a, &b, &c])).await;
    let after = homes_of(&b);
    assert_eq!(after, homes_of(&c));
    let moved = before.iter().zip(&after).filter(|(old, new)| old != new).count();
    assert!(before.iter().zip(&after).all(|(old, new)| old == new || *new == Some(c.this_node())));
    assert!((200..480).contains(&moved), "{moved} of 1000 users moved to the third node");

    // Settings every node must share are checked at join.
    let refused = scratch.try_join(placed(4, Placement::NginxHash)).await.err().expect("another placement");
    assert!(matches!(refused, JoinError::Mismatch { .. }), "{refused}");
    let refused = scratch.try_join(MembershipSettings { virtual_nodes: 100, ..placed(4, Placement::NginxConsistent) });
    let message = refused.await.err().expect("other ring points").to_string();
    assert!(message.contains(r#"cluster.virtual_nodes is "100" here but "160" in the cluster"#), "{message}");
    leave_all(&[&a, &b, &c]).await;

    // With no live node left, the next node's settings become the cluster's.
    let fresh = scratch.try_join(placed(5, Placement::NginxHash)).await.expect("an empty cluster takes new settings");
    assert_eq!(fresh.view().homes.placement(), Placement::NginxHash);
    leave_all(&[&fresh]).await;
}

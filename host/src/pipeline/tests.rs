//! `Pipeline::admit` on real parts (SQLite, group commit, seq leases, dedup marks, lanes,
//! membership, router): what each send is answered and what it leaves in storage.

use std::sync::Arc;

use herald_proto::v1::send_ack::Status;

use super::Admission;
use crate::model::{ConnectionId, NodeId};
use crate::routing::bus::{SendAck, SendRequest};
use crate::store::{ConversationStore, OwnerClaim, SeqLeases};
use crate::testkit::{
    BusCall, Kit, Options, RecordingBus, THIS_NODE, conversation_id, poll, request, settle, user_id, uuid,
};

const DM: &str = "dm:alice:bob";

/// Asserts `ack` answers `sent` (same origin, rid, client_msg_id) with `status`.
fn assert_answers(ack: &SendAck, sent: &SendRequest, status: Status) {
    assert_eq!(ack.ack.status(), status, "{:?}", ack.ack);
    assert_eq!(ack.to, sent.origin, "an ack goes back to where the send came from");
    assert_eq!(ack.rid, sent.rid, "an ack echoes the rid");
    assert_eq!(ack.ack.client_msg_id, sent.send.client_msg_id);
}

#[tokio::test]
async fn valid_sends_are_stored_and_acked_in_seq_order() {
    let kit = Kit::new().await;
    let first = request("alice", "phone", DM, &uuid(), "one");
    let second = request("alice", "phone", DM, &uuid(), "two");

    let one = kit.send(first.clone()).await;
    let two = kit.send(second.clone()).await;

    assert_answers(&one, &first, Status::Ok);
    assert_answers(&two, &second, Status::Ok);
    assert_eq!((one.ack.seq, two.ack.seq), (1, 2), "seqs count up from 1 in the order sends were admitted");
    assert_ne!(one.ack.message_id, two.ack.message_id);
    assert_eq!(one.ack.conversation, DM);
    let stored = kit.stored(DM).await;
    let rows: Vec<(u64, u64, &str, &str)> = stored
        .iter()
        .map(|m| (m.seq, m.id, m.client_msg_id.as_str(), std::str::from_utf8(&m.body).expect("utf-8")))
        .collect();
    assert_eq!(
        rows,
        vec![
            (1, one.ack.message_id, first.send.client_msg_id.as_str(), "one"),
            (2, two.ack.message_id, second.send.client_msg_id.as_str(), "two"),
        ],
        "each acked send is in storage with the ids it was acked with"
    );
    assert!(stored.iter().all(|m| m.sender == user_id("alice") && m.kind == first.send.kind));
    // Both users now follow the conversation, so a device of bob's that never acked it is
    // backfilled it.
    let followed = kit.database.user_conversations(&user_id("bob")).await.expect("read");
    assert_eq!(followed, vec![conversation_id(DM)]);
}

#[tokio::test]
async fn a_stored_send_is_released_to_fan_out() {
    let kit = Kit::new().await;
    let (_bob, bob_phone) = kit.connect("bob", "phone").await;
    let ack = kit.send_ok("alice", "phone", DM, "hi").await;
    let delivered = bob_phone.delivered();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!((delivered[0].seq, delivered[0].id), (ack.seq, ack.message_id));
    assert_eq!(&delivered[0].body[..], b"hi");
}

#[tokio::test]
async fn a_repeated_client_msg_id_answers_duplicate_with_the_original_ids() {
    let kit = Kit::new().await;
    let id = uuid();
    let original = kit.send(request("alice", "phone", DM, &id, "original")).await;
    assert_eq!(original.ack.status(), Status::Ok);

    // The retry: the same id, from another device and with another body.
    let retry = request("alice", "laptop", DM, &id, "changed");
    let admitted = kit.pipeline.admit(retry.clone()).await;
    let Admission::Done(duplicate) = admitted else { panic!("a stored duplicate is answered at once") };

    assert_answers(&duplicate, &retry, Status::Duplicate);
    assert_eq!((duplicate.ack.message_id, duplicate.ack.seq), (original.ack.message_id, original.ack.seq));
    let stored = kit.stored(DM).await;
    assert_eq!(stored.len(), 1, "nothing new stored: {stored:?}");
    assert_eq!(&stored[0].body[..], b"original");
}

#[tokio::test]
async fn a_duplicate_in_flight_waits_for_the_original_and_answers_with_its_ids() {
    let kit = Kit::new().await;
    let id = uuid();
    let first = request("alice", "phone", DM, &id, "body");
    let again = request("alice", "phone", DM, &id, "body");

    // Both admitted before either is durable.
    let original = kit.pipeline.admit(first).await;
    let duplicate = kit.pipeline.admit(again.clone()).await;
    assert!(matches!(duplicate, Admission::Wait(_)), "the duplicate waits for the original's outcome");
    let (original, duplicate) = tokio::join!(settle(original), settle(duplicate));

    assert_eq!(original.ack.status(), Status::Ok);
    assert_answers(&duplicate, &again, Status::Duplicate);
    assert_eq!((duplicate.ack.message_id, duplicate.ack.seq), (original.ack.message_id, original.ack.seq));
    assert_eq!(kit.stored(DM).await.len(), 1);
}

#[tokio::test]
async fn invalid_ids_are_rejected_and_store_nothing() {
    let kit = Kit::new().await;
    let bad = [
        request("alice", "phone", DM, "not-a-uuid", "x"),
        request("alice", "phone", "dm:bob:alice", &uuid(), "x"),
        request("alice", "phone", "chan:general", &uuid(), "x"),
        request("alice", "phone", "grp:a/b", &uuid(), "x"),
    ];
    for sent in bad {
        let ack = kit.send(sent.clone()).await;
        assert_answers(&ack, &sent, Status::Rejected);
        assert!(!ack.ack.reason.is_empty(), "a rejection says why");
        assert_eq!((ack.ack.seq, ack.ack.message_id), (0, 0));
    }
    assert!(kit.stored(DM).await.is_empty());
    assert!(kit.database.user_conversations(&user_id("alice")).await.expect("read").is_empty());
}

#[tokio::test]
async fn a_non_member_of_a_dm_is_rejected() {
    let kit = Kit::new().await;
    let id = uuid();
    let sent = request("carol", "phone", DM, &id, "let me in");
    let ack = kit.send(sent.clone()).await;
    assert_answers(&ack, &sent, Status::Rejected);
    assert!(ack.ack.reason.contains("carol"), "{:?}", ack.ack.reason);
    assert!(kit.stored(DM).await.is_empty());
    // Nothing was marked: a member may use the same client_msg_id.
    let member = kit.send(request("alice", "phone", DM, &id, "hi")).await;
    assert_eq!(member.ack.status(), Status::Ok);
}

#[tokio::test]
async fn a_room_send_needs_a_subscription_on_the_node_holding_the_connection() {
    let kit = Kit::new().await;
    let room = "room:lobby";
    let connection = kit.connection_id();
    let mut sent = request("alice", "phone", room, &uuid(), "hello room");
    sent.origin.connection = connection;

    let refused = kit.send(sent.clone()).await;
    assert_answers(&refused, &sent, Status::Rejected);
    assert!(refused.ack.reason.contains("subscribe"), "{:?}", refused.ack.reason);
    assert!(kit.stored(room).await.is_empty());

    // Forwarded from the node holding the connection, which checked the subscription: not
    // refused for want of one here.
    let mut forwarded = sent.clone();
    forwarded.origin.node = NodeId(THIS_NODE.0 + 1);
    forwarded.origin.connection = ConnectionId(connection.0 + 1_000);
    let accepted = kit.send(forwarded.clone()).await;
    assert_answers(&accepted, &forwarded, Status::Ok);
    assert_eq!(accepted.ack.seq, 1);

    // Subscribed here, the connection may send.
    kit.rooms.subscribe(&conversation_id(room), connection);
    let again = request("alice", "phone", room, &uuid(), "subscribed now");
    let mut again_here = again.clone();
    again_here.origin.connection = connection;
    let stored = kit.send(again_here.clone()).await;
    assert_answers(&stored, &again_here, Status::Ok);
    assert_eq!(kit.stored(room).await.len(), 2);
}

#[tokio::test]
async fn a_send_another_node_owns_goes_over_the_bus_and_leaves_no_trace_when_unreachable() {
    let owner = NodeId(THIS_NODE.0 + 1);
    let kit = Kit::with(Options { ring: vec![owner], ..Options::default() }).await;
    let id = uuid();
    let sent = request("alice", "phone", DM, &id, "over there");

    let ack = kit.send(sent.clone()).await;

    assert_answers(&ack, &sent, Status::Retry);
    assert!(ack.ack.reason.contains(&format!("node {owner}")), "names the owner: {:?}", ack.ack.reason);
    assert!(ack.ack.retry_after_ms > 0, "a retry comes with a hint of when");
    assert!(kit.stored(DM).await.is_empty());
    assert!(kit.database.user_conversations(&user_id("alice")).await.expect("read").is_empty());

    // The ring changes to name this node: the retry, with the same id, is processed — no
    // dedup mark was left behind to swallow it.
    kit.topology.replace(&[THIS_NODE]);
    let retried = kit.send(sent.clone()).await;
    assert_answers(&retried, &sent, Status::Ok);
    assert_eq!(retried.ack.seq, 1);
    assert_eq!(kit.stored(DM).await.len(), 1);
}

#[tokio::test]
async fn a_send_another_node_owns_is_answered_by_that_node() {
    let owner = NodeId(THIS_NODE.0 + 1);
    let bus = Arc::new(RecordingBus::default());
    let kit = Kit::with(Options { ring: vec![owner], bus: Arc::clone(&bus) as _, ..Options::default() }).await;
    let sent = request("alice", "phone", DM, &uuid(), "over there");

    let ack = kit.send(sent.clone()).await;

    let calls = bus.calls();
    let [BusCall::ForwardSend { owner: asked, request: forwarded }] = calls.as_slice() else {
        panic!("one forward_send expected, got {calls:?}")
    };
    assert_eq!(*asked, owner);
    assert_eq!((&forwarded.origin, forwarded.rid, &forwarded.send), (&sent.origin, sent.rid, &sent.send));
    let answer = RecordingBus::answer(&sent);
    assert_eq!((ack.to, ack.rid, ack.ack), (answer.to, answer.rid, answer.ack), "the owner's answer, unchanged");
    assert!(kit.stored(DM).await.is_empty(), "stored by the owner, not here");
}

/// A send forwarded here by another node, for a conversation this node's ring now gives to a
/// third: answered RETRY, not forwarded again (one hop only), and nothing is stored.
#[tokio::test]
async fn a_forwarded_send_this_node_no_longer_owns_is_not_forwarded_again() {
    let third = NodeId(THIS_NODE.0 + 2);
    let bus = Arc::new(RecordingBus::default());
    let kit = Kit::with(Options { ring: vec![third], bus: Arc::clone(&bus) as _, ..Options::default() }).await;
    let mut forwarded = request("alice", "phone", DM, &uuid(), "hop");
    forwarded.origin.node = NodeId(THIS_NODE.0 + 1);

    let ack = kit.send(forwarded).await;

    assert_eq!(ack.ack.status(), Status::Retry);
    assert!(ack.ack.reason.contains(&format!("node {third}")), "{}", ack.ack.reason);
    assert!(bus.calls().is_empty(), "not passed on: {:?}", bus.calls());
    assert!(kit.stored(DM).await.is_empty());
}

/// A node whose cluster lease may have lapsed must not act as an owner: the send is answered
/// RETRY, nothing is stored, and nothing is left behind to swallow the retry.
#[tokio::test]
async fn a_send_while_the_cluster_lease_is_in_doubt_answers_retry_and_stores_nothing() {
    let kit = Kit::new().await;
    kit.topology.set_holds_lease(false);
    let sent = request("alice", "phone", DM, &uuid(), "while fenced");

    let ack = kit.send(sent.clone()).await;

    assert_answers(&ack, &sent, Status::Retry);
    assert!(ack.ack.reason.contains("cannot act as the conversation's owner"), "{:?}", ack.ack.reason);
    assert!(ack.ack.retry_after_ms > 0, "a retry comes with a hint of when");
    assert_eq!((ack.ack.seq, ack.ack.message_id), (0, 0));
    assert!(kit.stored(DM).await.is_empty());

    kit.topology.set_holds_lease(true);
    let retried = kit.send(sent.clone()).await;
    assert_answers(&retried, &sent, Status::Ok);
    assert_eq!(kit.stored(DM).await.len(), 1);
}

/// Another node leased the conversation at a newer ring epoch than this node's: this node's
/// lease is refused and the send answered RETRY, until this node's ring is newer than the
/// other's; then it takes the conversation back, above every seq the other node was given.
#[tokio::test]
async fn a_send_to_a_conversation_another_node_took_over_retries_until_the_ring_is_newer() {
    let kit = Kit::new().await;
    let other = OwnerClaim { node: NodeId(THIS_NODE.0 + 8), epoch: 2 };
    let taken = kit.database.lease(&conversation_id(DM), 100, other).await.expect("the other node leases");
    let sent = request("alice", "phone", DM, &uuid(), "mine?");

    for epoch in [1, 2] {
        let ack = kit.send(sent.clone()).await;
        assert_answers(&ack, &sent, Status::Retry);
        assert!(ack.ack.reason.contains("another node took it over"), "at epoch {epoch}: {:?}", ack.ack.reason);
        assert!(kit.stored(DM).await.is_empty());
        assert_eq!(kit.topology.replace(&[THIS_NODE]), epoch + 1);
    }

    let retried = kit.send(sent.clone()).await;
    assert_answers(&retried, &sent, Status::Ok);
    assert!(retried.ack.seq > taken.range.last, "seq {} not above {:?}", retried.ack.seq, taken.range);
    assert_eq!(kit.stored(DM).await.len(), 1);
}

/// The ack of a stored send does not wait for its dedup mark to be completed (that runs
/// beside the fan-out); a retry arriving in between waits for the original and answers
/// with its ids.
#[tokio::test]
async fn a_retry_arriving_between_the_ack_and_the_completed_mark_answers_with_the_original_ids() {
    let kit = Kit::new().await;
    let id = uuid();
    let Admission::Wait(original) = kit.pipeline.admit(request("alice", "phone", DM, &id, "original")).await else {
        panic!("a fresh send waits for its commit");
    };
    let settled = original.await;
    assert_eq!(settled.ack.ack.status(), Status::Ok, "acked before the mark is completed");

    let retry = request("alice", "phone", DM, &id, "original");
    let Admission::Wait(duplicate) = kit.pipeline.admit(retry.clone()).await else {
        panic!("the mark is still pending: the retry waits for the original")
    };
    let answer = tokio::spawn(duplicate);
    settled.fan_out.expect("a stored send has a fan-out").await;

    let duplicate = answer.await.expect("no panic").ack;
    assert_answers(&duplicate, &retry, Status::Duplicate);
    assert_eq!((duplicate.ack.message_id, duplicate.ack.seq), (settled.ack.ack.message_id, settled.ack.ack.seq));
    assert_eq!(kit.stored(DM).await.len(), 1, "stored once");
}

/// A send whose future is dropped midway, its dedup mark taken (as a timeout around it
/// would drop it), lets the mark go: the client's retry with the same id is processed as
/// a new send, not made to wait for an original that will never end.
#[tokio::test]
async fn a_send_dropped_midway_lets_the_retry_of_its_id_through() {
    let kit = Kit::new().await;
    let sent = request("alice", "phone", DM, &uuid(), "first try");
    // Another send holds the conversation's lane: this one takes its mark, then waits its
    // turn there until it is dropped.
    let lane = kit.pipeline.lanes.get(&conversation_id(DM));
    let turn = lane.admit.lock().await;
    let mut admitting = Box::pin(kit.pipeline.admit(sent.clone()));
    tokio::select! {
        _ = &mut admitting => panic!("the send cannot end while another holds its lane"),
        () = poll::until("the send took its mark", async || kit.pipeline.dedup.held_here() == 1) => {}
    }
    drop(admitting);
    drop(turn);

    poll::until("the dropped send's mark is let go", async || kit.pipeline.dedup.held_here() == 0).await;
    let retried = kit.send(sent.clone()).await;
    assert_answers(&retried, &sent, Status::Ok);
    assert_eq!(retried.ack.seq, 1, "the dropped send took no seq");
    assert_eq!(kit.stored(DM).await.len(), 1);
}

/// An archived announcement for a room another node owns goes to that node marked as an
/// announcement (so the owner stores it as one posted to it, without the message-policy
/// hook), from the API's device, and its ids come back as the owner gave them.
#[tokio::test]
async fn an_announcement_another_node_owns_is_forwarded_marked_as_one() {
    let owner = NodeId(THIS_NODE.0 + 1);
    let bus = Arc::new(RecordingBus::default());
    let kit = Kit::with(Options { ring: vec![owner], bus: Arc::clone(&bus) as _, ..Options::default() }).await;
    let room = conversation_id("room:lobby");

    let announced = kit.pipeline.announce(&room, &user_id("announcer"), Some("a1"), b"doors open".to_vec(), true).await;

    let calls = bus.calls();
    let [BusCall::ForwardSend { owner: asked, request: forwarded }] = calls.as_slice() else {
        panic!("one forward_send expected, got {calls:?}")
    };
    assert_eq!(*asked, owner);
    assert!(forwarded.announcement, "marked as an announcement: {forwarded:?}");
    assert_eq!((forwarded.origin.user.as_str(), forwarded.origin.device.as_str()), ("announcer", "api"));
    assert_eq!(forwarded.send.conversation, "room:lobby");
    let answer = RecordingBus::answer(forwarded);
    let announced = announced.expect("stored by the owner");
    assert_eq!((announced.message_id, announced.seq), (answer.ack.message_id, answer.ack.seq));
    assert!(announced.archived && !announced.duplicate);
    assert!(kit.stored("room:lobby").await.is_empty(), "stored by the owner, not here");
}

/// On the owner, an announcement forwarded by another node is stored like one posted here;
/// one marked so for a conversation that is not a room is refused, never stored.
#[tokio::test]
async fn a_forwarded_announcement_is_stored_in_its_room_and_refused_anywhere_else() {
    let kit = Kit::new().await;
    let forwarded = |conversation: &str| {
        let mut sent = request("announcer", "api", conversation, &uuid(), "news");
        sent.origin.node = NodeId(THIS_NODE.0 + 1);
        sent.origin.connection = ConnectionId(0);
        sent.announcement = true;
        sent
    };

    let into_room = forwarded("room:lobby");
    let ack = kit.send(into_room.clone()).await;
    assert_answers(&ack, &into_room, Status::Ok);
    assert_eq!(kit.stored("room:lobby").await.len(), 1);

    let into_direct = forwarded(DM);
    let ack = kit.send(into_direct.clone()).await;
    assert_answers(&ack, &into_direct, Status::Rejected);
    assert!(ack.ack.reason.contains("an announcement goes to a room"), "{:?}", ack.ack.reason);
    assert!(kit.stored(DM).await.is_empty());
}

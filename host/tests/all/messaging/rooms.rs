//! Broadcast rooms: subscribe / unsubscribe, live fan-out to the connections subscribed
//! now, catch-up with `since_seq`.

use herald_proto::v1::{self, frame::Body};

use super::client::Client;
use super::dm;
use super::server::Herald;

const ROOM: &str = "room:lobby";

/// Whether `client` kept a deliver of message `id`.
pub(super) fn kept_deliver_of(client: &Client, id: u64) -> bool {
    client
        .kept()
        .iter()
        .any(|f| matches!(&f.body, Some(Body::Deliver(d)) if d.message.as_ref().is_some_and(|m| m.id == id)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_get_room_messages_live_and_late_joiners_catch_up() {
    let herald = Herald::start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let mut carol = Client::connect(&herald, "carol", "phone").await;

    let subscribed = alice.subscribe(ROOM, None).await;
    assert_eq!(subscribed.room, ROOM);
    assert_eq!(subscribed.latest_seq, 0, "a new room has no messages: {subscribed:?}");
    assert!(subscribed.messages.is_empty(), "no catch-up unless since_seq is set");
    bob.subscribe(ROOM, None).await;

    // Live fan-out to subscribers only.
    let first = alice.send_ok(ROOM, "hello room").await;
    assert_eq!(first.conversation, ROOM);
    let message = bob.deliver_of(first.message_id).await.message.expect("message");
    assert_eq!((message.conversation.as_str(), message.seq, message.sender.as_str()), (ROOM, first.seq, "alice"));
    assert_eq!(message.body.as_ref(), b"hello room");
    let marker = alice.send_ok(&dm("alice", "carol"), "marker").await;
    carol.deliver_of(marker.message_id).await;
    assert!(!kept_deliver_of(&carol, first.message_id), "carol is not subscribed: {}", carol.unclaimed());

    // Unsubscribed: no more.
    bob.unsubscribe(ROOM).await;
    let second = alice.send_ok(ROOM, "bob has left").await;
    assert!(second.seq > first.seq);
    let marker = alice.send_ok(&dm("alice", "bob"), "marker").await;
    bob.deliver_of(marker.message_id).await;
    assert!(!kept_deliver_of(&bob, second.message_id), "bob unsubscribed: {}", bob.unclaimed());

    // Catch-up with since_seq.
    let caught_up = carol.subscribe(ROOM, Some(0)).await;
    let ids: Vec<(u64, u64)> = caught_up.messages.iter().map(|m| (m.id, m.seq)).collect();
    assert_eq!(ids, vec![(first.message_id, first.seq), (second.message_id, second.seq)], "catch-up since 0");
    assert_eq!(caught_up.latest_seq, second.seq);
    let mut dave = Client::connect(&herald, "dave", "phone").await;
    let partial = dave.subscribe(ROOM, Some(first.seq)).await;
    assert_eq!(partial.messages.iter().map(|m| m.id).collect::<Vec<_>>(), vec![second.message_id], "since first.seq");
    let mut erin = Client::connect(&herald, "erin", "phone").await;
    let plain = erin.subscribe(ROOM, None).await;
    assert!(plain.messages.is_empty());
    assert_eq!(plain.latest_seq, second.seq, "latest_seq is the room's newest seq");

    // The late joiners are live now, and may send.
    let third = dave.send_ok(ROOM, "hi from dave").await;
    for client in [&mut alice, &mut carol, &mut erin] {
        client.deliver_of(third.message_id).await;
    }
    // History pages the room too.
    let history = erin.whole_history(ROOM).await;
    assert_eq!(
        history.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![first.message_id, second.message_id, third.message_id]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribing_to_something_that_is_not_a_room_is_an_error() {
    let herald = Herald::start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    for room in ["lobby", "room:", "room:two words", &dm("alice", "bob"), "grp:team"] {
        let rid = alice.send_frame(v1::Subscribe { room: room.to_owned(), since_seq: None }).await;
        let outcome = alice
            .try_reply(rid, "subscribed", |body| match body {
                Body::Subscribed(subscribed) => Some(subscribed.clone()),
                _ => None,
            })
            .await;
        match outcome {
            Err(error) => assert!(!error.code.is_empty() && !error.message.is_empty(), "{room:?}: {error:?}"),
            Ok(subscribed) => panic!("subscribe to {room:?} must fail, got {subscribed:?}"),
        }
    }
    // The connection stays open.
    alice.ping().await;
}

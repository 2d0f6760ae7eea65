//! Two protocol clients chatting through `herald-relay`.

use bytes::Bytes;
use herald_examples::{
    ConnectionError,
    relay::{Relay, RelayConfig},
};
use herald_proto::{
    Encoding,
    v1::{self, Frame, frame::Body, send_ack::Status},
};

use crate::{STEP, login, next};

fn send(rid: u32, id: &str, conversation: &str, text: &str) -> Frame {
    Frame::new(
        rid,
        v1::Send {
            client_msg_id: id.to_owned(),
            conversation: conversation.to_owned(),
            kind: 1,
            body: Bytes::from(text.to_owned()),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_chat_with_ids_and_bodies_intact() {
    let relay = Relay::spawn_local(RelayConfig::default()).await.expect("relay binds");
    let url = relay.url();
    // One side speaks protobuf, the other JSON: the relay encodes per connection.
    let mut alice = login(&url, "alice", "laptop", Encoding::Proto).await;
    let mut bob = login(&url, "bob", "phone", Encoding::Json).await;

    alice.send(&send(7, "c0ffee00-0000-4000-8000-000000000001", "dm:alice:bob", "hi bob")).await.expect("send");
    let Frame { rid, body: Some(Body::SendAck(ack)) } = next(&mut alice).await else {
        panic!("expected send_ack");
    };
    assert_eq!(rid, 7, "the reply echoes the rid");
    assert_eq!(ack.status(), Status::Ok);
    assert_eq!(ack.client_msg_id, "c0ffee00-0000-4000-8000-000000000001");
    assert_eq!(ack.conversation, "dm:alice:bob");
    assert!(ack.message_id > 0 && ack.seq > 0);

    let Frame { rid, body: Some(Body::Deliver(deliver)) } = next(&mut bob).await else {
        panic!("expected deliver");
    };
    assert_eq!(rid, 0, "server-initiated frames carry rid 0");
    assert_eq!(deliver.attempt, 1);
    let message = deliver.message.expect("deliver carries a message");
    assert_eq!(message.id, ack.message_id);
    assert_eq!(message.seq, ack.seq);
    assert_eq!(message.sender, "alice");
    assert_eq!(message.sender_device, "laptop");
    assert_eq!(message.conversation, "dm:alice:bob");
    assert_eq!(message.kind, 1);
    assert_eq!(message.body, Bytes::from_static(b"hi bob"));
    let ack_frame = Frame::new(0, v1::DeliverAck { conversation: message.conversation.clone(), seq: message.seq });
    bob.send(&ack_frame).await.expect("deliver_ack");

    // And back.
    bob.send(&send(1, "c0ffee00-0000-4000-8000-000000000002", "dm:alice:bob", "hi alice")).await.expect("send");
    let Some(Body::SendAck(reply_ack)) = next(&mut bob).await.body else {
        panic!("expected send_ack");
    };
    assert_eq!(reply_ack.status(), Status::Ok);
    assert!(reply_ack.seq > ack.seq, "seqs increase");
    let Some(Body::Deliver(deliver)) = next(&mut alice).await.body else {
        panic!("expected deliver");
    };
    let message = deliver.message.expect("message");
    assert_eq!(message.body, Bytes::from_static(b"hi alice"));
    assert_eq!(message.sender, "bob");

    // Pings are answered with the same rid.
    alice.send(&Frame::new(42, v1::Ping { time_ms: 123, reply: false })).await.expect("ping");
    assert_eq!(next(&mut alice).await, Frame::new(42, v1::Pong { time_ms: 123 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outsiders_and_bad_conversations_are_rejected() {
    let relay = Relay::spawn_local(RelayConfig::default()).await.expect("relay binds");
    let mut carol = login(&relay.url(), "carol", "d", Encoding::Proto).await;
    for (conversation, reason) in
        [("dm:alice:bob", "not a member"), ("dm:carol:alice", "invalid conversation"), ("room:lobby", "subscribe")]
    {
        carol.send(&send(3, "c0ffee00-0000-4000-8000-000000000003", conversation, "x")).await.expect("send");
        let Some(Body::SendAck(ack)) = next(&mut carol).await.body else {
            panic!("expected send_ack");
        };
        assert_eq!(ack.status(), Status::Rejected, "{conversation}");
        assert!(ack.reason.contains(reason), "{conversation}: {}", ack.reason);
        assert_eq!(ack.message_id, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_fan_out_to_subscribers() {
    let relay = Relay::spawn_local(RelayConfig::default()).await.expect("relay binds");
    let url = relay.url();
    let mut members = Vec::new();
    for user in ["ann", "ben", "cat"] {
        let mut connection = login(&url, user, "d", Encoding::Json).await;
        connection
            .send(&Frame::new(5, v1::Subscribe { room: "room:lobby".to_owned(), since_seq: None }))
            .await
            .expect("subscribe");
        let Some(Body::Subscribed(subscribed)) = next(&mut connection).await.body else {
            panic!("expected subscribed");
        };
        assert_eq!(subscribed.room, "room:lobby");
        members.push(connection);
    }
    members[0].send(&send(6, "c0ffee00-0000-4000-8000-000000000004", "room:lobby", "hello all")).await.expect("send");
    let Some(Body::SendAck(ack)) = next(&mut members[0]).await.body else {
        panic!("expected send_ack");
    };
    assert_eq!(ack.status(), Status::Ok);
    for member in &mut members[1..] {
        let Some(Body::Deliver(deliver)) = next(member).await.body else {
            panic!("expected deliver");
        };
        let message = deliver.message.expect("message");
        assert_eq!((message.sender.as_str(), message.id), ("ann", ack.message_id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_violations_close_with_their_codes() {
    let relay = Relay::spawn_local(RelayConfig::default()).await.expect("relay binds");
    let url = relay.url();

    let mut stranger = herald_examples::Connection::open(&url, Encoding::Proto, STEP).await.expect("opens");
    let refused = stranger.login("jwt-not-accepted", "d", "test", STEP).await;
    assert_eq!(refused.expect_err("bad token").close_code(), Some(4001));

    let mut early = herald_examples::Connection::open(&url, Encoding::Proto, STEP).await.expect("opens");
    early.send(&Frame::new(1, v1::Ping { time_ms: 1, reply: false })).await.expect("writes");
    let closed = tokio::time::timeout(STEP, early.recv()).await.expect("in time");
    assert_eq!(closed.expect_err("closed").close_code(), Some(4010));

    // A second login of the same user and device kicks the first.
    let mut first = login(&url, "dora", "tablet", Encoding::Proto).await;
    let _second = login(&url, "dora", "tablet", Encoding::Proto).await;
    let kicked = tokio::time::timeout(STEP, first.recv()).await.expect("in time");
    assert!(matches!(kicked, Err(ConnectionError::Closed { code: 4009, .. })), "{kicked:?}");
}

//! 1:1 chat: round trips in both subprotocols, idempotent sends, pipelined sends.

use std::collections::HashSet;

use herald_proto::Encoding;
use herald_proto::v1::frame::Body;
use herald_proto::v1::send_ack::Status;
use serde_json::Value;

use super::client::{Client, now_ms};
use super::server::Herald;
use super::{WAIT, dm, uuid};

/// Bytes that survive only if nobody treats the body as text: NUL, invalid UTF-8, and a
/// multi-byte character.
const BINARY_BODY: &[u8] = b"\x00\x01hello \xe2\x9c\x93 \xff\xfe\x80 end";

async fn round_trip(sender_encoding: Encoding, recipient_encoding: Encoding) {
    let herald = Herald::start().await;
    let mut bob = Client::connect_with(&herald, recipient_encoding, "bob", "phone").await;
    let mut alice = Client::connect_with(&herald, sender_encoding, "alice", "laptop").await;

    let connected = alice.connected.clone().expect("alice is connected");
    assert!(connected.heartbeat_ms > 0, "connected.heartbeat_ms must be set: {connected:?}");
    assert!(!connected.session_id.is_empty(), "connected.session_id must be set: {connected:?}");
    let skew = connected.server_time_ms.abs_diff(now_ms());
    assert!(skew < 300_000, "connected.server_time_ms is not the wall clock in ms: {connected:?}");

    let conversation = dm("alice", "bob");
    let client_msg_id = uuid();
    let before = now_ms();
    let rid = alice.send_with(&client_msg_id, &conversation, 42, BINARY_BODY).await;
    let (ack_rid, ack) = alice
        .wait_for("send_ack", WAIT, |frame| match &frame.body {
            Some(Body::SendAck(ack)) if ack.client_msg_id == client_msg_id => Some((frame.rid, ack.clone())),
            _ => None,
        })
        .await;
    assert_eq!(ack_rid, rid, "send_ack must echo the send's rid");
    assert_eq!(ack.status(), Status::Ok, "{ack:?}");
    assert_eq!(ack.conversation, conversation);
    assert!(ack.message_id != 0 && ack.seq != 0, "OK carries message_id and seq: {ack:?}");

    let (deliver_rid, deliver) = bob
        .wait_for("the deliver", WAIT, |frame| match &frame.body {
            Some(Body::Deliver(deliver)) => Some((frame.rid, deliver.clone())),
            _ => None,
        })
        .await;
    assert_eq!(deliver_rid, 0, "server-initiated frames carry rid 0");
    assert_eq!(deliver.attempt, 1, "first push is attempt 1");
    let message = deliver.message.expect("deliver carries the message");
    assert_eq!(message.id, ack.message_id, "deliver and send_ack name the same message id");
    assert_eq!(message.seq, ack.seq, "deliver and send_ack name the same seq");
    assert_eq!(message.conversation, conversation);
    assert_eq!(message.sender, "alice");
    assert_eq!(message.sender_device, "laptop");
    assert_eq!(message.kind, 42);
    assert_eq!(message.body.as_ref(), BINARY_BODY, "body bytes intact");
    assert!(
        message.sent_at_ms + 60_000 >= before && message.sent_at_ms <= now_ms() + 60_000,
        "sent_at_ms is the server's wall clock in ms: {} (test clock {before})",
        message.sent_at_ms
    );
    bob.deliver_ack(&conversation, message.seq).await;

    // And back.
    let reply = bob.send_ok(&conversation, "hi alice").await;
    assert!(reply.seq > ack.seq, "seq increases in the conversation: {} then {}", ack.seq, reply.seq);
    let back = alice.deliver_in(&conversation).await.message.expect("message");
    assert_eq!((back.id, back.seq, back.sender.as_str()), (reply.message_id, reply.seq, "bob"));
    assert_eq!(back.body.as_ref(), b"hi alice");

    for client in [&alice, &bob] {
        if client.encoding == Encoding::Json {
            check_canonical_json(&client.raw_texts);
        }
    }
}

/// PROTOCOL.md: lowerCamelCase names, 64-bit integers as strings, bytes as base64.
fn check_canonical_json(texts: &[String]) {
    let frames: Vec<Value> = texts.iter().map(|t| serde_json::from_str(t).expect("server JSON frames parse")).collect();
    for frame in &frames {
        let object = frame.as_object().expect("a frame is a JSON object");
        for key in object.keys() {
            assert!(!key.contains('_'), "JSON frames use lowerCamelCase names, got {key:?} in {frame}");
        }
        if let Some(ack) = frame.get("sendAck") {
            assert!(ack["messageId"].is_string(), "uint64 message_id is a JSON string: {frame}");
            assert!(ack["seq"].is_string(), "uint64 seq is a JSON string: {frame}");
            assert!(ack["status"].is_string(), "enums are written by name: {frame}");
        }
        if let Some(deliver) = frame.get("deliver") {
            let message = &deliver["message"];
            assert!(message["id"].is_string(), "uint64 id is a JSON string: {frame}");
            assert!(message["sentAtMs"].is_string(), "sent_at_ms is spelled sentAtMs, as a string: {frame}");
            assert!(message["senderDevice"].is_string(), "sender_device is spelled senderDevice: {frame}");
            assert!(message["body"].is_string(), "bytes are base64 strings: {frame}");
        }
    }
    assert!(frames.iter().any(|f| f.get("connected").is_some()), "saw the connected frame");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_keeps_ids_and_body_over_protobuf() {
    round_trip(Encoding::Proto, Encoding::Proto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_keeps_ids_and_body_over_json() {
    round_trip(Encoding::Json, Encoding::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_and_json_clients_talk_to_each_other() {
    round_trip(Encoding::Proto, Encoding::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_client_msg_id_100_times_is_stored_once_with_the_same_ids() {
    let herald = Herald::start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let conversation = dm("alice", "bob");
    let client_msg_id = uuid();

    // One after the other: the first is OK, every later one DUPLICATE with the original ids.
    alice.send_with(&client_msg_id, &conversation, 1, b"once").await;
    let first = alice.ack_of(&client_msg_id).await;
    assert_eq!(first.status(), Status::Ok, "{first:?}");
    for attempt in 2..=100 {
        alice.send_with(&client_msg_id, &conversation, 1, b"once").await;
        let again = alice.ack_of(&client_msg_id).await;
        assert_eq!(again.status(), Status::Duplicate, "send #{attempt}: {again:?}");
        assert_eq!(
            (again.message_id, again.seq),
            (first.message_id, first.seq),
            "send #{attempt} returns the original ids"
        );
    }

    // All at once: still nothing new (RETRY would mean "resend", which the loop does).
    for _ in 0..100 {
        alice.send_with(&client_msg_id, &conversation, 1, b"once").await;
    }
    for attempt in 0..100 {
        let mut again = alice.ack_of(&client_msg_id).await;
        while again.status() == Status::Retry {
            alice.send_with(&client_msg_id, &conversation, 1, b"once").await;
            again = alice.ack_of(&client_msg_id).await;
        }
        assert_eq!(again.status(), Status::Duplicate, "pipelined send #{attempt}: {again:?}");
        assert_eq!((again.message_id, again.seq), (first.message_id, first.seq));
    }

    // Dedup is per sender: bob may use the same client_msg_id for a message of his own.
    bob.send_with(&client_msg_id, &conversation, 1, b"bob's own").await;
    let bobs = bob.ack_of(&client_msg_id).await;
    assert_eq!(bobs.status(), Status::Ok, "the same client_msg_id from another sender is another message: {bobs:?}");
    assert_ne!(bobs.message_id, first.message_id);

    // Bob was delivered it once (redeliveries aside), and history holds two messages.
    let delivered = bob.distinct_deliveries(&conversation, 1).await;
    assert_eq!(delivered[0].id, first.message_id);
    let history = bob.whole_history(&conversation).await;
    let ids: Vec<u64> = history.iter().map(|m| m.id).collect();
    assert_eq!(ids, vec![first.message_id, bobs.message_id], "history: {history:?}");
}

/// A `client_msg_id` reused in another conversation is a duplicate of the first send, and
/// its `send_ack` names the conversation the original was stored in (PROTOCOL.md): the dedup
/// mark keeps only a hash of that conversation, so the answer comes from the unique index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_msg_id_reused_in_another_conversation_answers_with_the_original() {
    let herald = Herald::start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let (with_bob, with_carol) = (dm("alice", "bob"), dm("alice", "carol"));
    let client_msg_id = uuid();
    alice.send_with(&client_msg_id, &with_bob, 1, b"to bob").await;
    let first = alice.ack_of(&client_msg_id).await;
    assert_eq!(first.status(), Status::Ok, "{first:?}");

    alice.send_with(&client_msg_id, &with_carol, 1, b"to carol").await;
    let reused = alice.ack_of(&client_msg_id).await;
    assert_eq!(reused.status(), Status::Duplicate, "{reused:?}");
    assert_eq!((reused.message_id, reused.seq), (first.message_id, first.seq), "the original's ids");
    assert_eq!(reused.conversation, with_bob, "the conversation the original was stored in");

    // The original's own retry is still answered with its ids and conversation.
    alice.send_with(&client_msg_id, &with_bob, 1, b"to bob").await;
    let retried = alice.ack_of(&client_msg_id).await;
    assert_eq!(retried.status(), Status::Duplicate, "{retried:?}");
    assert_eq!(
        (retried.message_id, retried.seq, retried.conversation),
        (first.message_id, first.seq, with_bob.clone())
    );

    assert!(alice.whole_history(&with_carol).await.is_empty(), "nothing was stored for carol");
    assert_eq!(alice.whole_history(&with_bob).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_pipelined_sends_get_strictly_increasing_seqs_in_send_order() {
    let herald = Herald::start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let conversation = dm("alice", "bob");

    let ids: Vec<String> = (0..50).map(|_| uuid()).collect();
    for (i, id) in ids.iter().enumerate() {
        alice.send_with(id, &conversation, 1, format!("message {i}").as_bytes()).await;
    }
    let mut acks = Vec::new();
    for id in &ids {
        let ack = alice.ack_of(id).await;
        assert_eq!(ack.status(), Status::Ok, "{ack:?}");
        acks.push(ack);
    }
    for pair in acks.windows(2) {
        assert!(pair[0].seq < pair[1].seq, "seqs follow send order: {} then {}", pair[0].seq, pair[1].seq);
    }
    let unique: HashSet<u64> = acks.iter().map(|a| a.message_id).collect();
    assert_eq!(unique.len(), 50, "every message has its own id");

    let delivered = bob.distinct_deliveries(&conversation, 50).await;
    let seqs: Vec<u64> = delivered.iter().map(|m| m.seq).collect();
    let sent: Vec<u64> = acks.iter().map(|a| a.seq).collect();
    assert_eq!(seqs, sent, "bob gets all 50, in seq order");
    for (i, message) in delivered.iter().enumerate() {
        assert_eq!(message.id, acks[i].message_id);
        assert_eq!(message.body.as_ref(), format!("message {i}").as_bytes());
    }
}

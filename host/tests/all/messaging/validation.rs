//! Bad input gets a clear REJECTED (with a reason) and changes nothing: membership
//! violations, malformed conversation names and ids.

use std::time::Duration;

use herald_proto::Encoding;
use herald_proto::v1::frame::Body;
use herald_proto::v1::send_ack::Status;

use super::client::Client;
use super::dm;
use super::server::Herald;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_violations_are_rejected_and_deliver_nothing() {
    let herald = Herald::start().await;
    herald.create_group("team", &["alice", "bob"]).await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let mut carol = Client::connect(&herald, "carol", "phone").await;

    // A dm carol is not part of.
    carol.send_rejected(&dm("alice", "bob"), "let me in").await;
    // A group carol is not a member of, and one that does not exist.
    carol.send_rejected("grp:team", "let me in").await;
    carol.send_rejected("grp:no-such-group", "anyone?").await;
    // A room without subscribing first.
    carol.send_rejected("room:lobby", "not subscribed").await;

    // None of it reached anyone: the next thing alice and bob get is a real message.
    let ack = bob.send_ok(&dm("alice", "bob"), "marker").await;
    let next = alice.deliver_in(&dm("alice", "bob")).await.message.expect("message");
    assert_eq!(next.id, ack.message_id, "alice got the marker, nothing from carol before it");
    let group = alice.send_ok("grp:team", "group marker").await;
    let next = bob.deliver_in("grp:team").await.message.expect("message");
    assert_eq!(next.id, group.message_id);
    for client in [&alice, &bob] {
        let from_carol = client.kept().into_iter().any(
            |f| matches!(&f.body, Some(Body::Deliver(d)) if d.message.as_ref().is_some_and(|m| m.sender == "carol")),
        );
        assert!(!from_carol, "nothing from carol was delivered: {}", client.unclaimed());
    }
    assert_eq!(bob.whole_history(&dm("alice", "bob")).await.len(), 1, "the rejected dm was not stored");
    assert_eq!(bob.whole_history("grp:team").await.len(), 1, "the rejected group message was not stored");
    // After subscribing the room send works.
    carol.subscribe("room:lobby", None).await;
    carol.send_ok("room:lobby", "now subscribed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_conversations_and_ids_are_rejected_with_a_reason() {
    let herald = Herald::start().await;
    let mut alice = Client::connect_with(&herald, Encoding::Json, "alice", "laptop").await;
    let too_long = format!("room:{}", "x".repeat(129));
    let bad_conversations = [
        "",
        "alice",
        "dm:alice",
        "dm:bob:alice",     // not in byte order
        "dm:alice:alice",   // a < b strictly
        "dm:alice:bob:eve", // three members
        "dm::bob",
        "grp:",
        "room:",
        "room:two words",
        "room:caf\u{e9}",
        "room:semi;colon",
        "chan:lobby",
        "ROOM:lobby",
        too_long.as_str(),
    ];
    for conversation in bad_conversations {
        let reason = alice.send_rejected(conversation, "bad name").await;
        assert!(!reason.is_empty());
    }
    // A 128-byte name is fine.
    let longest = format!("room:{}", "y".repeat(128));
    alice.subscribe(&longest, None).await;
    alice.send_ok(&longest, "long but legal").await;

    // client_msg_id must be a UUID.
    for client_msg_id in ["", "not-a-uuid", "12345", "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"] {
        alice.send_with(client_msg_id, &dm("alice", "bob"), 1, b"bad id").await;
        let ack = alice.ack_of(client_msg_id).await;
        assert_eq!(ack.status(), Status::Rejected, "client_msg_id {client_msg_id:?}: {ack:?}");
        assert!(!ack.reason.is_empty(), "REJECTED says why: {ack:?}");
    }
    // The connection is still fine, and nothing was stored in the dm.
    let ack = alice.send_ok(&dm("alice", "bob"), "valid").await;
    let history = alice.whole_history(&dm("alice", "bob")).await;
    assert_eq!(
        history.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![ack.message_id],
        "only the valid message is stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_user_or_device_ids_are_not_connected_nor_altered() {
    let herald = Herald::start().await;
    for (token, device, what) in [
        ("dev:alice", "two words", "device id with a space"),
        ("dev:alice", "", "empty device id"),
        ("dev:alice", &"d".repeat(129)[..], "device id of 129 bytes"),
        ("dev:al ice", "phone", "user id with a space"),
        ("dev:", "phone", "empty user id"),
        ("dev:\u{e9}mile", "phone", "user id with a non-ASCII letter"),
    ] {
        let mut client = Client::open(&herald, Encoding::Proto).await;
        match client.login(token, device).await {
            Ok(connected) => panic!("{what}: must be refused, never altered, got {connected:?}"),
            Err(why) => assert!(!why.is_empty()),
        }
    }
    // Legal punctuation is kept exactly.
    let user = "a.b_c@d-e";
    let client = Client::connect(&herald, user, "Device-1.x_y@z").await;
    let connected = client.connected.clone().expect("connected");
    assert_eq!(connected.user_id, user);
    // Anything the server sent to the refused ones aside, the valid client is quiet.
    let mut client = client;
    client
        .assert_quiet(Duration::from_millis(200), "no error on a valid login", |f| {
            matches!(f.body, Some(Body::Error(_)))
        })
        .await;
}

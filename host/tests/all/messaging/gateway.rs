//! The WebSocket edge: authentication, the connect timeout, bad frames, the frame size
//! limit, and the same device logging in twice — each with PROTOCOL.md's close code.

use herald_proto::Encoding;
use herald_proto::v1::{self, Frame};
use serde_json::json;
use tokio_tungstenite::tungstenite::{Bytes, Message};

use super::client::Client;
use super::server::{DEV_KEY, Herald};
use super::token::{self, now_s};
use super::{dm, uuid};
use crate::support::poll::poll;

const SECRET: &[u8] = b"e2e-test-secret-0123456789abcdef";

fn secret() -> String {
    String::from_utf8(SECRET.to_vec()).expect("ASCII secret")
}

/// Logs in with `token` and expects the server to close with 4001.
async fn refused(herald: &Herald, token: &str, why: &str) {
    let mut client = Client::open(herald, Encoding::Proto).await;
    if let Ok(connected) = client.login(token, "phone").await {
        panic!("{why}: the server accepted the token as {connected:?}\n{}", herald.log_tail());
    }
    client.expect_close_code(4001, why).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_with_the_configured_secret_connects_as_its_subject() {
    let herald = Herald::with().set("GATEWAY__JWT_SECRET", secret()).start().await;
    let mut client = Client::open(&herald, Encoding::Proto).await;
    let connected = client.login(&token::valid(SECRET, "alice"), "phone").await.unwrap_or_else(|why| panic!("{why}"));
    assert_eq!((connected.user_id.as_str(), connected.device_id.as_str()), ("alice", "phone"));
    // With nbf in the past and no exp claim trouble either.
    let mut other = Client::open(&herald, Encoding::Proto).await;
    let claims = json!({ "sub": "bob", "nbf": now_s() - 60, "exp": now_s() + 60 });
    let connected = other.login(&token::sign(SECRET, &claims), "tablet").await.unwrap_or_else(|why| panic!("{why}"));
    assert_eq!(connected.user_id, "bob");
    // The session works.
    let ack = client.send_ok(&dm("alice", "bob"), "signed in").await;
    assert_eq!(other.deliver_of(ack.message_id).await.attempt, 1);
}

/// Tokens that are not JWTs of this server at all; the claims and algorithms a JWT of the
/// right shape may get wrong are rows of `auth_table`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_foreign_tokens_close_with_4001() {
    let herald = Herald::with().set("GATEWAY__JWT_SECRET", secret()).start().await;
    refused(&herald, "not-a-jwt", "garbage token").await;
    refused(&herald, "", "empty token").await;
    refused(&herald, &token::valid(b"some-other-secret-entirely-000000", "alice"), "JWT signed with another secret")
        .await;
    let mut tampered = token::valid(SECRET, "alice");
    tampered.push('x');
    refused(&herald, &tampered, "JWT with a tampered signature").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_dev_mode_dev_tokens_and_the_dev_key_are_refused() {
    let herald = Herald::with().production().set("GATEWAY__JWT_SECRET", secret()).start().await;
    refused(&herald, "dev:alice", "dev: token without --dev").await;
    let mut client = Client::open(&herald, Encoding::Proto).await;
    client
        .login(&token::valid(SECRET, "alice"), "phone")
        .await
        .unwrap_or_else(|why| panic!("a valid JWT still works: {why}"));

    let token = herald.post("/v1/dev/token", None, &json!({ "user": "alice" })).await;
    assert!(!token.is_success(), "POST /v1/dev/token must not work without --dev: {token:?}");
    let group = herald.post("/v1/groups", Some(DEV_KEY), &json!({ "id": "team", "members": ["alice"] })).await;
    assert!(group.status == 401 || group.status == 403, "dev-key must not be an api key without --dev: {group:?}");
    group.error_code();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connect_within_the_timeout_closes_with_4002() {
    let herald = Herald::with().set("GATEWAY__CONNECT_TIMEOUT_MS", 300).start().await;
    let mut client = Client::open(&herald, Encoding::Proto).await;
    client.expect_close_code(4002, "no connect within GATEWAY__CONNECT_TIMEOUT_MS").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_other_than_connect_first_closes_with_4010() {
    let herald = Herald::start().await;
    let mut client = Client::open(&herald, Encoding::Proto).await;
    client.send_with(&uuid(), &dm("alice", "bob"), 1, b"who am I?").await;
    client.expect_close_code(4010, "send before connect").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_frames_close_with_4010() {
    let herald = Herald::start().await;
    // Protobuf connection: bytes that are no protobuf (field 31, wire type 7).
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    alice.send_message(Message::Binary(Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0x07]))).await;
    alice.expect_close_code(4010, "garbage binary frame").await;

    // JSON connection: text that is no JSON.
    let mut bob = Client::connect_with(&herald, Encoding::Json, "bob", "phone").await;
    bob.send_message(Message::text("{\"rid\": 1, \"send\": {oops")).await;
    bob.expect_close_code(4010, "garbage JSON frame").await;

    // A well-formed frame without a body.
    let mut carol = Client::connect(&herald, "carol", "phone").await;
    carol.send_framed(Frame { rid: 9, body: None }).await;
    carol.expect_close_code(4010, "frame without a body").await;

    // Someone still connected is not disturbed.
    let mut dave = Client::connect(&herald, "dave", "phone").await;
    dave.ping().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_size_limit_closes_with_1009() {
    let herald = Herald::with().set("GATEWAY__MAX_FRAME_BYTES", 65_536).start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let conversation = dm("alice", "bob");
    // Under the limit: fine.
    alice.send_ok(&conversation, vec![b'a'; 60_000]).await;
    // Over it: closed with 1009.
    alice.send_with(&uuid(), &conversation, 1, &vec![b'b'; 70_000]).await;
    alice.expect_close_code(1009, "a 70 kB frame with GATEWAY__MAX_FRAME_BYTES = 65536").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_sends_go_away_then_closes_with_1012_in_either_encoding() {
    let mut herald = Herald::with().set("GATEWAY__GO_AWAY_SPREAD_MS", 2_000).start().await;
    let mut alice = Client::connect(&herald, "alice", "phone").await;
    let mut bob = Client::connect_with(&herald, Encoding::Json, "bob", "phone").await;
    assert!(herald.get("/readyz", None).await.is_success(), "ready before shutdown");

    assert!(herald.terminate().await, "herald exits cleanly on SIGTERM\n{}", herald.log_tail());
    for client in [&mut alice, &mut bob] {
        let go_away = client
            .wait_for("go_away", super::WAIT, |frame| match &frame.body {
                Some(v1::frame::Body::GoAway(go_away)) => Some(go_away.clone()),
                _ => None,
            })
            .await;
        assert!(go_away.reason.contains("shutting down"), "{go_away:?}");
        assert!(go_away.reconnect_after_ms <= 2_000, "within GATEWAY__GO_AWAY_SPREAD_MS: {go_away:?}");
        client.expect_close_code(1012, "after go_away").await;
    }
}

/// With `gateway.shutdown_delay_ms`, a stopping node first only answers `/readyz` with 503
/// (so a load balancer stops sending clients) while it goes on serving everyone, new
/// clients too; then it drains as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_delay_answers_readyz_503_while_the_node_still_serves() {
    let mut herald = Herald::with().set("GATEWAY__SHUTDOWN_DELAY_MS", 5_000).start().await;
    let mut alice = Client::connect(&herald, "alice", "phone").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;

    herald.signal("TERM");
    let draining = poll().within(super::WAIT).every(std::time::Duration::from_millis(20));
    let readyz = draining
        .until("/readyz to answer 503", async || {
            let readyz = herald.get("/readyz", None).await;
            if readyz.status == 503 { Ok(readyz) } else { Err(format!("{readyz:?}")) }
        })
        .await;
    assert_eq!(readyz.json()["error"]["code"], "draining", "{readyz:?}");
    // Still serving: a send is delivered, and a new device connects and sends.
    let ack = alice.send_ok(&dm("alice", "bob"), "still here?").await;
    bob.deliver_of(ack.message_id).await;
    let mut carol = Client::connect(&herald, "carol", "phone").await;
    carol.send_ok(&dm("alice", "carol"), "just in").await;

    // Then the drain: go_away, 1012, a clean exit.
    for client in [&mut alice, &mut bob, &mut carol] {
        client
            .wait_for("go_away", super::WAIT, |frame| match &frame.body {
                Some(v1::frame::Body::GoAway(go_away)) => Some(go_away.clone()),
                _ => None,
            })
            .await;
        client.expect_close_code(1012, "after go_away").await;
    }
    assert!(herald.wait_exit().await, "herald exits cleanly\n{}", herald.log_tail());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_device_connecting_again_kicks_the_old_connection_with_4009() {
    let herald = Herald::start().await;
    let mut old = Client::connect(&herald, "alice", "phone").await;
    let mut other_device = Client::connect(&herald, "alice", "laptop").await;
    let mut new = Client::connect(&herald, "alice", "phone").await;
    old.expect_close_code(4009, "alice/phone connected again").await;

    // The new connection and the other device carry on.
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let ack = bob.send_ok(&dm("alice", "bob"), "which phone?").await;
    new.deliver_of(ack.message_id).await;
    other_device.deliver_of(ack.message_id).await;
    new.send_ok(&dm("alice", "bob"), "this one").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_offering_no_subprotocol_speaks_protobuf() {
    let herald = Herald::start().await;
    let (mut client, chosen) = Client::open_offering(&herald, None).await;
    assert_eq!(chosen, None, "no subprotocol offered, none selected");
    let connected = client.login("dev:alice", "phone").await.unwrap_or_else(|why| panic!("{why}"));
    assert_eq!(connected.user_id, "alice");
    client.ping().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors_keep_the_connection_open() {
    let herald = Herald::start().await;
    let mut carol = Client::connect(&herald, "carol", "phone").await;
    // History of a conversation carol is not in: an error frame for that rid, nothing more.
    let rid = carol.send_history(&dm("alice", "bob"), 0, 10).await;
    let error = carol
        .try_reply(rid, "history_reply", |body| match body {
            v1::frame::Body::HistoryReply(reply) => Some(reply.clone()),
            _ => None,
        })
        .await;
    let error = match error {
        Err(error) => error,
        Ok(reply) => panic!("carol may not read dm:alice:bob, got {reply:?}"),
    };
    assert!(!error.code.is_empty() && !error.message.is_empty(), "error frames carry code and message: {error:?}");
    assert_eq!(error.rid, rid, "error.rid names the failed request");
    carol.ping().await;
}

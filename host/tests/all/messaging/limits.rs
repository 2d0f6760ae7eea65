//! Limits on every resource a client can make the node hold, each configurable and each
//! answered with PROTOCOL.md's close code, HTTP status or error code: slow headers and
//! silent sockets, trickled bodies, body size, rooms per connection, cursors per `sync`,
//! members per group, frames per second, and permessage-deflate (never negotiated).
//!
//! Limits tested elsewhere: connections per node and per address (`intake`), frame size
//! (`gateway::a_frame_over_the_size_limit_closes_with_1009`), token length
//! (`auth_table::a_token_of_64_kib_is_refused`).

use std::time::Duration;

use herald_proto::v1;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::client::Client;
use super::server::{DEV_KEY, Herald};
use super::{WAIT, dm};

/// Reads until the server closes the socket; panics if it has not within `WAIT`. Returns
/// what it sent.
async fn until_server_closes(stream: &mut TcpStream, what: &str) -> Vec<u8> {
    let deadline = Instant::now() + WAIT;
    let mut received = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Err(_) => panic!("{what}: the server still holds the connection after {WAIT:?}"),
            Ok(Ok(0) | Err(_)) => return received,
            Ok(Ok(read)) => received.extend_from_slice(&chunk[..read]),
        }
    }
}

async fn connect(herald: &Herald) -> TcpStream {
    TcpStream::connect(("127.0.0.1", herald.port)).await.expect("TCP connect")
}

async fn short_header_timeout() -> Herald {
    Herald::with().set("GATEWAY__HEADER_READ_TIMEOUT_MS", 300).start().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_that_never_sends_is_closed_after_the_header_read_timeout() {
    let herald = short_header_timeout().await;
    let mut silent = connect(&herald).await;
    let answer = until_server_closes(&mut silent, "a socket that sends nothing").await;
    assert!(answer.is_empty(), "nothing was asked, nothing is answered: {:?}", String::from_utf8_lossy(&answer));
    // The server is fine and answers those who ask in time.
    assert_eq!(herald.get("/healthz", None).await.status, 200);
}

/// Slowloris: headers trickled a byte at a time, each within any per-read timeout, never
/// finishing. The timeout runs from the first byte, so trickling does not extend it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_trickled_in_are_cut_off_for_http_and_for_the_websocket_upgrade() {
    let herald = short_header_timeout().await;
    for path in ["/healthz", "/v1/ws"] {
        let mut slow = connect(&herald).await;
        slow.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n").as_bytes()).await.expect("write");
        let trickle = async {
            for byte in b"X-Slow: ".iter().chain([b'a'; 1000].iter()).cycle() {
                if slow.write_all(&[*byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let cut_off = tokio::time::timeout(WAIT, trickle).await;
        assert!(cut_off.is_ok(), "GET {path} with trickled headers: still open after {WAIT:?}");
    }
    assert_eq!(herald.get("/healthz", None).await.status, 200);
}

/// An HTTP body trickled in (or never finished) is answered 408 after
/// `api.request_timeout_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_trickled_in_is_answered_408() {
    let herald = Herald::with().set("API__REQUEST_TIMEOUT_MS", 300).start().await;
    let mut slow = connect(&herald).await;
    let head = "POST /v1/groups HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
                Authorization: Bearer dev-key\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":";
    slow.write_all(head.as_bytes()).await.expect("write");
    let answer = String::from_utf8_lossy(&until_server_closes(&mut slow, "a body that never ends").await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"timeout\""), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_answered_413() {
    let herald = Herald::with().set("API__MAX_BODY_BYTES", 2048).start().await;
    let big = json!({ "content": "x".repeat(4096) });
    let response = herald.post("/v1/rooms/lobby/announcements", Some(DEV_KEY), &big).await;
    assert_eq!(response.status, 413, "{response:?}");
    assert_eq!(response.error_code(), "too_large");
    let small = herald.post("/v1/rooms/lobby/announcements", Some(DEV_KEY), &json!({ "content": "hi" })).await;
    assert!(small.is_success(), "under the limit: {small:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_per_connection_are_capped_and_the_connection_stays_open() {
    let herald = Herald::with().set("DELIVERY__MAX_ROOMS_PER_CONNECTION", 3).start().await;
    let mut alice = Client::connect(&herald, "alice", "phone").await;
    for room in ["room:a", "room:b", "room:c", "room:a"] {
        alice.subscribe(room, None).await;
    }
    let rid = alice.send_frame(v1::Subscribe { room: "room:d".into(), since_seq: None }).await;
    let error = alice.try_reply(rid, "subscribed", |_| None::<()>).await.expect_err("a fourth room");
    assert_eq!(error.code, "limit_exceeded", "{error:?}");
    assert!(error.message.contains("max_rooms_per_connection"), "{error:?}");
    alice.unsubscribe("room:b").await;
    alice.subscribe("room:d", None).await;
    // Another connection has its own share.
    let mut other = Client::connect(&herald, "alice", "tablet").await;
    for room in ["room:b", "room:e", "room:f"] {
        other.subscribe(room, None).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_per_sync_are_capped() {
    let herald = Herald::with().set("DELIVERY__MAX_SYNC_CURSORS", 2).start().await;
    let mut alice = Client::connect(&herald, "alice", "phone").await;
    let cursors: Vec<v1::Cursor> =
        ["bob", "carol", "dave"].iter().map(|peer| v1::Cursor { conversation: dm("alice", peer), seq: 0 }).collect();
    let rid = alice.send_frame(v1::Sync { cursors, limit: 10 }).await;
    let error = alice.try_reply(rid, "sync_reply", |_| None::<()>).await.expect_err("three cursors");
    assert_eq!(error.code, "limit_exceeded", "{error:?}");
    let reply = alice.sync(&[(&dm("alice", "bob"), 0), (&dm("alice", "carol"), 0)], 10).await;
    assert_eq!(reply.conversations.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_per_group_are_capped() {
    let herald = Herald::with().set("API__MAX_GROUP_MEMBERS", 3).start().await;
    let too_many = json!({ "id": "big", "members": ["a", "b", "c", "d"] });
    let response = herald.post("/v1/groups", Some(DEV_KEY), &too_many).await;
    assert_eq!(response.status, 409, "{response:?}");
    assert_eq!(response.error_code(), "limit_exceeded");
    herald.create_group("team", &["a", "b", "c"]).await;
    let put =
        async |user: &str| herald.request("PUT", &format!("/v1/groups/team/members/{user}"), Some(DEV_KEY), None).await;
    let full = put("d").await;
    assert_eq!((full.status, full.error_code().as_str()), (409, "limit_exceeded"), "{full:?}");
    assert_eq!(put("c").await.status, 204, "a member added again changes nothing");
    let removed = herald.request("DELETE", "/v1/groups/team/members/a", Some(DEV_KEY), None).await;
    assert_eq!(removed.status, 204);
    assert_eq!(put("d").await.status, 204, "a place freed is taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flooding_frames_is_closed_with_4029() {
    let herald = Herald::with().set("GATEWAY__FRAMES_PER_SECOND", 20).set("GATEWAY__FRAME_BURST", 40).start().await;
    let mut calm = Client::connect(&herald, "alice", "phone").await;
    for _ in 0..10 {
        calm.ping().await;
    }
    let mut flood = Client::connect(&herald, "mallory", "phone").await;
    for n in 0..400 {
        flood.send_frame(v1::Ping { time_ms: n + 1, reply: false }).await;
    }
    let closed = flood.expect_close_code(4029, "400 pings at once against a rate of 20/s").await;
    assert!(closed.reason.contains("frames per second"), "{closed:?}");
    calm.ping().await;
}

/// Compression is off: a client offering permessage-deflate gets plain frames, so no
/// deflate bomb can be sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permessage_deflate_is_never_negotiated() {
    let herald = Herald::start().await;
    let mut stream = connect(&herald).await;
    let request = format!(
        "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: herald.v1.proto\r\n\
         Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n",
        herald.port
    );
    stream.write_all(request.as_bytes()).await.expect("write the handshake");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let read = tokio::time::timeout(WAIT, stream.read(&mut byte)).await.expect("an answer").expect("read");
        assert!(read == 1, "the server closed during the handshake: {}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(!head.contains("sec-websocket-extensions"), "no extension is accepted: {head}");
}

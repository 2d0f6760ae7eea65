//! Integration tests of the Herald examples, in one binary to save link time: the relay
//! with real protocol clients, the load generator against the relay, the shipped binaries
//! end to end, and `herald-chat` against a real Herald (`HERALD_BIN`, default the
//! workspace's debug build). Everything listens on 127.0.0.1 port 0.

mod binaries;
mod chat_on_herald;
mod loadgen;
mod relay_chat;

use std::time::Duration;

use herald_examples::Connection;
use herald_proto::{Encoding, v1::Frame};

/// Longest any single step of a test may take.
pub const STEP: Duration = Duration::from_secs(10);

/// Opens a connection to `url` and logs in as `user` with a dev token.
pub async fn login(url: &str, user: &str, device: &str, encoding: Encoding) -> Connection {
    let mut connection = Connection::open(url, encoding, STEP).await.expect("WebSocket opens");
    let connected =
        connection.login(&format!("dev:{user}"), device, "herald-examples-tests", STEP).await.expect("login succeeds");
    assert_eq!(connected.user_id, user);
    assert_eq!(connected.device_id, device);
    connection
}

/// The next frame, failing the test after [`STEP`].
pub async fn next(connection: &mut Connection) -> Frame {
    tokio::time::timeout(STEP, connection.recv())
        .await
        .expect("a frame arrives in time")
        .expect("the connection stays open")
}

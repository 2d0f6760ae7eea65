//! Heartbeats: the server pings every `heartbeat_ms`; a client that answers stays; a client
//! that says nothing at all is closed after about three intervals.

use std::time::Duration;

use herald_proto::v1::{self, frame::Body};

use super::client::Client;
use super::raw::{Event, RawSocket};
use super::server::Herald;
use super::{WAIT, dm};

const HEARTBEAT_MS: u64 = 200;

async fn herald() -> Herald {
    Herald::with().set("GATEWAY__HEARTBEAT_MS", HEARTBEAT_MS).start().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_pings_arrive_and_client_pings_are_answered() {
    let herald = herald().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let connected = alice.connected.clone().expect("connected");
    assert_eq!(u64::from(connected.heartbeat_ms), HEARTBEAT_MS, "connected.heartbeat_ms is the configured interval");

    for _ in 0..3 {
        let ping = alice.wait_for_server_ping(WAIT).await;
        assert_eq!(ping.rid, 0, "server-initiated frames carry rid 0: {ping:?}");
    }
    // Either side may ping; the server answers with the same time_ms (checked by `ping`).
    alice.ping().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_answers_pings_stays_connected() {
    let herald = herald().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    // Ten intervals of nothing but pongs (the client answers pings while reading).
    alice
        .assert_quiet(Duration::from_millis(10 * HEARTBEAT_MS), "an answering client stays connected", |_| false)
        .await;
    assert!(alice.server_pings.len() >= 3, "pings kept coming: {}", alice.server_pings.len());
    // (bob connects only now: a client that does not read cannot answer pings.)
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let ack = bob.send_ok(&dm("alice", "bob"), "still there?").await;
    alice.deliver_of(ack.message_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_closed_after_about_three_intervals() {
    let herald = herald().await;
    let mut silent = RawSocket::open(&herald).await;
    silent.login("alice", "silent").await;
    // From here on the client writes nothing: no pong, no WebSocket pong, nothing.
    let (end, elapsed, before) = silent.until_closed(WAIT).await;
    assert!(
        matches!(end, Event::Close(..) | Event::Ended(_)),
        "a client silent for 3 heartbeat intervals must be closed; still open after {elapsed:?}\n{}",
        herald.log_tail()
    );
    let pings = before
        .iter()
        .filter(|e| matches!(e, Event::WsPing | Event::Frame(v1::Frame { body: Some(Body::Ping(_)), .. })))
        .count();
    assert!(pings >= 1, "the server pinged before giving up: {before:?}");
    assert!(
        elapsed >= Duration::from_millis(2 * HEARTBEAT_MS),
        "closed after {elapsed:?}, before even 2 intervals of {HEARTBEAT_MS} ms: {end:?}"
    );

    // A client that talks is not affected.
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    alice.ping().await;
}

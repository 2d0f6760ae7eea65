//! Heartbeats: the server writes at least every `heartbeat_ms` (a `ping` when it has
//! nothing else to send), asks for a `pong` only when the client has been silent long
//! enough that its `client_timeout_ms` nears, and closes a client that says nothing at all.

use std::time::Duration;

use herald_proto::v1::{self, frame::Body};

use super::client::Client;
use super::raw::{Event, RawSocket};
use super::server::Herald;
use super::{WAIT, dm};

const HEARTBEAT_MS: u64 = 200;
/// Five heartbeats: an idle client is asked for an answer from the third on.
const CLIENT_TIMEOUT_MS: u64 = 1_000;

async fn herald() -> Herald {
    Herald::with()
        .set("GATEWAY__HEARTBEAT_MS", HEARTBEAT_MS)
        .set("GATEWAY__CLIENT_TIMEOUT_MS", CLIENT_TIMEOUT_MS)
        .start()
        .await
}

fn asks(ping: &v1::Frame) -> bool {
    matches!(&ping.body, Some(Body::Ping(ping)) if ping.reply)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_is_pinged_and_asked_to_answer_only_as_its_timeout_nears() {
    let herald = herald().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let connected = alice.connected.clone().expect("connected");
    assert_eq!(u64::from(connected.heartbeat_ms), HEARTBEAT_MS, "connected.heartbeat_ms is the configured interval");
    assert_eq!(u64::from(connected.client_timeout_ms), CLIENT_TIMEOUT_MS, "connected.client_timeout_ms is in force");

    // Twelve pings: more than two client timeouts of silence but for the answers asked.
    while alice.server_pings.len() < 12 {
        alice.wait_for_server_ping(WAIT).await;
    }
    assert!(alice.server_pings.iter().all(|ping| ping.rid == 0), "server-initiated frames carry rid 0");
    let asked = alice.server_pings.iter().filter(|ping| asks(ping)).count();
    assert!(asked >= 2, "an idle client is asked to answer before its timeout, again and again: {asked} of 12");
    assert!(
        asked < alice.server_pings.len(),
        "a client heard from recently is not asked to answer: every ping asked ({:?})",
        alice.server_pings
    );
    // Either side may ping; the server answers every client ping (checked by `ping`).
    alice.ping().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_answers_only_what_is_asked_stays_connected() {
    let herald = herald().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    // Until four pings asked: three client timeouts of silence but for the answers. A
    // close would end the wait with a panic naming it.
    while alice.server_pings.iter().filter(|ping| asks(ping)).count() < 4 {
        alice.wait_for_server_ping(WAIT).await;
    }
    // (bob connects only now: a client that does not read cannot answer pings.)
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let ack = bob.send_ok(&dm("alice", "bob"), "still there?").await;
    alice.deliver_of(ack.message_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_only_reads_a_busy_room_is_still_asked_and_stays() {
    let herald = herald().await;
    let mut reader = Client::connect(&herald, "reader", "tablet").await;
    reader.subscribe("room:busy", None).await;
    let mut talker = Client::connect(&herald, "talker", "phone").await;
    talker.subscribe("room:busy", None).await;
    // The room keeps the reader's connection busy, so no ping is due for idleness; the
    // reader writes nothing but the answers it is asked for, and must stay.
    let mut seen = 0;
    while reader.server_pings.iter().filter(|ping| asks(ping)).count() < 3 {
        let ack = talker.send_ok("room:busy", format!("news {seen}")).await;
        reader.deliver_of(ack.message_id).await;
        seen += 1;
        // Pacing only: about four messages a heartbeat, so the connection never idles.
        tokio::time::sleep(Duration::from_millis(HEARTBEAT_MS / 4)).await;
    }
    assert!(seen > 0, "messages flowed while the reader was asked to answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_closed_after_its_timeout() {
    let herald = herald().await;
    let mut silent = RawSocket::open(&herald).await;
    silent.login("alice", "silent").await;
    // From here on the client writes nothing: no pong, no WebSocket pong, nothing.
    let (end, elapsed, before) = silent.until_closed(WAIT).await;
    assert!(
        matches!(&end, Event::Close(_, reason) if reason == &format!("no traffic for {CLIENT_TIMEOUT_MS} ms")),
        "a silent client must be closed once its timeout runs out; got {end:?} after {elapsed:?}\n{}",
        herald.log_tail()
    );
    let asked = before
        .iter()
        .filter(|e| matches!(e, Event::Frame(v1::Frame { body: Some(Body::Ping(ping)), .. }) if ping.reply))
        .count();
    assert!(asked >= 1, "the server asked for an answer before giving up: {before:?}");

    // A client that talks is not affected.
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    alice.ping().await;
}

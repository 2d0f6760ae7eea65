//! The core's rules without a socket: frames in, frames out, on tokio's paused clock.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{Command, Core};
use crate::options::ClientOptions;
use crate::types::Event;
use crate::wire::v1::{self, frame::Body};

struct Harness {
    core: Core,
    _events: mpsc::UnboundedReceiver<Event>,
    _commands: mpsc::UnboundedSender<Command>,
}

/// A core connected to a server with this heartbeat and client timeout (0: an older server).
fn connected(heartbeat_ms: u32, client_timeout_ms: u32) -> Harness {
    let (events_tx, events) = mpsc::unbounded_channel();
    let (commands, _) = mpsc::unbounded_channel();
    let options = ClientOptions::new("ws://127.0.0.1:1/v1/ws", "dev:alice", "test");
    let (state, _) = tokio::sync::watch::channel(crate::State::Connecting);
    let mut core = Core::new(options, events_tx, commands.downgrade(), state);
    core.begin_attempt();
    open(&mut core, heartbeat_ms, client_timeout_ms);
    Harness { core, _events: events, _commands: commands }
}

fn open(core: &mut Core, heartbeat_ms: u32, client_timeout_ms: u32) {
    core.socket_opened();
    let connected = v1::Connected {
        user_id: "alice".to_owned(),
        device_id: "test".to_owned(),
        heartbeat_ms,
        client_timeout_ms,
        ..Default::default()
    };
    core.on_frame(v1::Frame { rid: 1, body: Some(connected.into()) });
}

fn sends(frames: &[v1::Frame]) -> Vec<String> {
    frames
        .iter()
        .filter_map(|frame| match &frame.body {
            Some(Body::Send(send)) => Some(send.client_msg_id.clone()),
            _ => None,
        })
        .collect()
}

fn send(core: &mut Core, id: &str) -> oneshot::Receiver<Result<crate::Sent, crate::SendError>> {
    let (reply, answer) = oneshot::channel();
    core.on_command(Command::Send {
        conversation: "dm:alice:bob".to_owned(),
        kind: 0,
        body: bytes::Bytes::from_static(b"hi"),
        client_msg_id: id.to_owned(),
        timeout: None,
        reply,
    });
    answer
}

#[tokio::test(start_paused = true)]
async fn pings_are_answered_only_when_asked() {
    let mut harness = connected(12_000, 90_000);
    let core = &mut harness.core;
    core.take_outbox();
    core.on_frame(v1::Frame { rid: 0, body: Some(v1::Ping { time_ms: 4, reply: false }.into()) });
    assert!(core.take_outbox().is_empty(), "a ping that does not ask is not answered");
    core.on_frame(v1::Frame { rid: 9, body: Some(v1::Ping { time_ms: 5, reply: true }.into()) });
    let out = core.take_outbox();
    assert_eq!(out, [v1::Frame { rid: 9, body: Some(v1::Pong { time_ms: 5 }.into()) }]);

    // A server from before `reply` (no client_timeout_ms) never asks: every ping is answered.
    let mut older = connected(12_000, 0);
    older.core.take_outbox();
    older.core.on_frame(v1::Frame { rid: 0, body: Some(v1::Ping { time_ms: 6, reply: false }.into()) });
    assert_eq!(older.core.take_outbox().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_silent_server_is_dropped_after_heartbeat_plus_three_seconds_and_never_woken_for_early() {
    let mut harness = connected(12_000, 90_000);
    let core = &mut harness.core;
    core.take_outbox();
    tokio::time::advance(Duration::from_secs(8)).await;
    core.on_timer(Instant::now());
    assert!(core.take_drop_request().is_none());
    assert!(core.next_wakeup().is_some_and(|at| at > Instant::now()), "no wake-up already past");
    assert!(core.take_outbox().is_empty(), "no client ping against a server whose heartbeat fits");
    tokio::time::advance(Duration::from_millis(7_001)).await;
    core.on_timer(Instant::now());
    assert_eq!(core.take_drop_request().map(|(code, _)| code), Some(4000));
}

#[tokio::test(start_paused = true)]
async fn retry_resends_the_same_client_msg_id_after_the_wait() {
    let mut harness = connected(12_000, 90_000);
    let core = &mut harness.core;
    core.take_outbox();
    let _answer = send(core, "id-1");
    assert_eq!(sends(&core.take_outbox()), ["id-1"]);
    let retry = v1::SendAck {
        client_msg_id: "id-1".to_owned(),
        status: v1::send_ack::Status::Retry.into(),
        retry_after_ms: 200,
        ..Default::default()
    };
    core.on_frame(v1::Frame { rid: 2, body: Some(retry.into()) });
    assert!(sends(&core.take_outbox()).is_empty(), "not before retry_after_ms");
    tokio::time::advance(Duration::from_millis(200)).await;
    core.on_timer(Instant::now());
    assert_eq!(sends(&core.take_outbox()), ["id-1"]);
}

#[tokio::test(start_paused = true)]
async fn a_lost_connection_resends_pending_sends_in_call_order_with_their_ids() {
    let mut harness = connected(12_000, 90_000);
    let core = &mut harness.core;
    let (_first, _second) = (send(core, "id-1"), send(core, "id-2"));
    core.take_outbox();
    core.on_drop(1006, "gone".to_owned());
    let _third = send(core, "id-3");
    assert!(core.take_outbox().is_empty(), "nothing is written without a socket");
    core.reconnect_at = None;
    core.begin_attempt();
    open(core, 12_000, 90_000);
    assert_eq!(sends(&core.take_outbox()), ["id-1", "id-2", "id-3"]);
}
